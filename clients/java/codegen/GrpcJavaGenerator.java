/*
 * A protoc plugin that writes grpc-java service classes (FooGrpc.java): method descriptors, the
 * async / blocking / future client stubs, the AsyncService interface, the FooImplBase server base
 * class, bindService and the reflection descriptor suppliers, in the layout of grpc-java's own
 * protoc-gen-grpc-java.
 *
 * Why it exists: Maven Central serves no io.grpc:protoc-gen-grpc-java executable for this machine
 * (the classifier files of the current versions answer 404 here), so clients/java/generate.sh runs
 * this single source file with the JDK's source launcher instead (java -cp protobuf-java.jar
 * GrpcJavaGenerator.java). It needs only protobuf-java and produces deterministic output.
 *
 * Scope: proto3/proto2 files with services; unary, server-, client- and bidi-streaming methods.
 * Options understood: java_package, java_multiple_files, java_outer_classname, deprecated.
 */

import com.google.protobuf.DescriptorProtos.DescriptorProto;
import com.google.protobuf.DescriptorProtos.EnumDescriptorProto;
import com.google.protobuf.DescriptorProtos.FileDescriptorProto;
import com.google.protobuf.DescriptorProtos.MethodDescriptorProto;
import com.google.protobuf.DescriptorProtos.ServiceDescriptorProto;
import com.google.protobuf.DescriptorProtos.SourceCodeInfo;
import com.google.protobuf.compiler.PluginProtos.CodeGeneratorRequest;
import com.google.protobuf.compiler.PluginProtos.CodeGeneratorResponse;
import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

public final class GrpcJavaGenerator {

  private static final int SERVICE_FIELD = 6; // FileDescriptorProto.service
  private static final int METHOD_FIELD = 2; // ServiceDescriptorProto.method

  private final Map<String, String> javaTypes = new HashMap<>();

  public static void main(String[] args) throws IOException {
    CodeGeneratorRequest request = CodeGeneratorRequest.parseFrom(System.in);
    CodeGeneratorResponse response = new GrpcJavaGenerator().generate(request);
    response.writeTo(System.out);
    System.out.flush();
  }

  CodeGeneratorResponse generate(CodeGeneratorRequest request) {
    CodeGeneratorResponse.Builder response = CodeGeneratorResponse.newBuilder()
        .setSupportedFeatures(CodeGeneratorResponse.Feature.FEATURE_PROTO3_OPTIONAL_VALUE);
    for (FileDescriptorProto file : request.getProtoFileList()) {
      indexTypes(file);
    }
    for (String name : request.getFileToGenerateList()) {
      FileDescriptorProto file = request.getProtoFileList().stream()
          .filter(f -> f.getName().equals(name))
          .findFirst()
          .orElseThrow();
      for (int i = 0; i < file.getServiceCount(); i++) {
        ServiceDescriptorProto service = file.getService(i);
        String pkg = javaPackage(file);
        String className = service.getName() + "Grpc";
        String path = (pkg.isEmpty() ? "" : pkg.replace('.', '/') + "/") + className + ".java";
        response.addFile(CodeGeneratorResponse.File.newBuilder()
            .setName(path)
            .setContent(new ServiceWriter(file, i, service).write()));
      }
    }
    return response.build();
  }

  // ---- names ------------------------------------------------------------------------------------

  private static String javaPackage(FileDescriptorProto file) {
    if (file.getOptions().hasJavaPackage()) {
      return file.getOptions().getJavaPackage();
    }
    return file.getPackage();
  }

  private static String outerClassName(FileDescriptorProto file) {
    if (file.getOptions().hasJavaOuterClassname()) {
      return file.getOptions().getJavaOuterClassname();
    }
    String base = file.getName();
    base = base.substring(base.lastIndexOf('/') + 1);
    if (base.endsWith(".proto")) {
      base = base.substring(0, base.length() - ".proto".length());
    }
    String camel = underscoresToCamelCase(base, true);
    boolean clash = file.getMessageTypeList().stream().anyMatch(m -> m.getName().equals(camel))
        || file.getEnumTypeList().stream().anyMatch(e -> e.getName().equals(camel))
        || file.getServiceList().stream().anyMatch(s -> s.getName().equals(camel));
    return clash ? camel + "OuterClass" : camel;
  }

  private void indexTypes(FileDescriptorProto file) {
    String protoPrefix = file.getPackage().isEmpty() ? "." : "." + file.getPackage() + ".";
    String pkg = javaPackage(file);
    String javaPrefix = (pkg.isEmpty() ? "" : pkg + ".")
        + (file.getOptions().getJavaMultipleFiles() ? "" : outerClassName(file) + ".");
    for (DescriptorProto message : file.getMessageTypeList()) {
      indexMessage(message, protoPrefix, javaPrefix);
    }
    for (EnumDescriptorProto e : file.getEnumTypeList()) {
      javaTypes.put(protoPrefix + e.getName(), javaPrefix + e.getName());
    }
  }

  private void indexMessage(DescriptorProto message, String protoPrefix, String javaPrefix) {
    String protoName = protoPrefix + message.getName();
    String javaName = javaPrefix + message.getName();
    javaTypes.put(protoName, javaName);
    for (DescriptorProto nested : message.getNestedTypeList()) {
      indexMessage(nested, protoName + ".", javaName + ".");
    }
  }

  private String javaType(String protoType) {
    String type = javaTypes.get(protoType);
    if (type == null) {
      throw new IllegalStateException("unknown message type " + protoType);
    }
    return type;
  }

  static String underscoresToCamelCase(String input, boolean capitalizeFirst) {
    StringBuilder out = new StringBuilder();
    boolean upper = capitalizeFirst;
    for (int i = 0; i < input.length(); i++) {
      char c = input.charAt(i);
      if (Character.isLowerCase(c)) {
        out.append(upper ? Character.toUpperCase(c) : c);
        upper = false;
      } else if (Character.isUpperCase(c)) {
        out.append(i == 0 && !capitalizeFirst ? Character.toLowerCase(c) : c);
        upper = false;
      } else if (Character.isDigit(c)) {
        out.append(c);
        upper = true;
      } else {
        upper = true;
      }
    }
    return out.toString();
  }

  /** lowerCamel Java method name of an RPC, as grpc-java names it. */
  static String methodName(String rpcName) {
    String name = underscoresToCamelCase(rpcName, false);
    return JAVA_KEYWORDS.contains(name) ? name + "_" : name;
  }

  /** METHODID_UPPER_SNAKE constant name. */
  static String methodIdName(String rpcName) {
    StringBuilder out = new StringBuilder();
    for (int i = 0; i < rpcName.length(); i++) {
      char c = rpcName.charAt(i);
      if (i > 0 && Character.isUpperCase(c) && !Character.isUpperCase(rpcName.charAt(i - 1))) {
        out.append('_');
      }
      out.append(c == '_' ? '_' : Character.toUpperCase(c));
    }
    return "METHODID_" + out.toString().replace("__", "_").toUpperCase(Locale.ROOT);
  }

  private static final java.util.Set<String> JAVA_KEYWORDS = java.util.Set.of(
      "abstract", "assert", "boolean", "break", "byte", "case", "catch", "char", "class", "const",
      "continue", "default", "do", "double", "else", "enum", "extends", "final", "finally",
      "float", "for", "goto", "if", "implements", "import", "instanceof", "int", "interface",
      "long", "native", "new", "package", "private", "protected", "public", "return", "short",
      "static", "strictfp", "super", "switch", "synchronized", "this", "throw", "throws",
      "transient", "try", "void", "volatile", "while", "true", "false", "null");

  // ---- comments ---------------------------------------------------------------------------------

  private static String comment(FileDescriptorProto file, List<Integer> path) {
    for (SourceCodeInfo.Location location : file.getSourceCodeInfo().getLocationList()) {
      if (location.getPathList().equals(path) && location.hasLeadingComments()) {
        return location.getLeadingComments();
      }
    }
    return "";
  }

  /** A javadoc block with the proto comment in a pre element, escaped as grpc-java does. */
  private static void javadoc(StringBuilder out, String indent, String text) {
    if (text.isBlank()) {
      return;
    }
    String escaped = text
        .replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace("*/", "*&#47;")
        .replace("@", "&#64;")
        .replace("\\", "&#92;");
    out.append(indent).append("/**\n");
    out.append(indent).append(" * <pre>\n");
    String[] lines = escaped.split("\n", -1);
    int end = lines.length;
    while (end > 0 && lines[end - 1].isBlank()) {
      end--;
    }
    for (int i = 0; i < end; i++) {
      String line = lines[i].startsWith(" ") ? lines[i].substring(1) : lines[i];
      out.append(indent).append(" *").append(line.isEmpty() ? "" : " " + line).append('\n');
    }
    out.append(indent).append(" * </pre>\n");
    out.append(indent).append(" */\n");
  }

  // ---- the service class ------------------------------------------------------------------------

  private final class ServiceWriter {
    private final FileDescriptorProto file;
    private final int serviceIndex;
    private final ServiceDescriptorProto service;
    private final String className;
    private final List<Method> methods = new ArrayList<>();
    private final StringBuilder out = new StringBuilder();

    ServiceWriter(FileDescriptorProto file, int serviceIndex, ServiceDescriptorProto service) {
      this.file = file;
      this.serviceIndex = serviceIndex;
      this.service = service;
      this.className = service.getName() + "Grpc";
      for (int i = 0; i < service.getMethodCount(); i++) {
        methods.add(new Method(i, service.getMethod(i)));
      }
    }

    private final class Method {
      final int index;
      final MethodDescriptorProto proto;
      final String name;
      final String javaName;
      final String getter;
      final String idName;
      final String in;
      final String outType;
      final boolean clientStreaming;
      final boolean serverStreaming;
      final String doc;

      Method(int index, MethodDescriptorProto proto) {
        this.index = index;
        this.proto = proto;
        this.name = proto.getName();
        this.javaName = methodName(name);
        this.getter = "get" + underscoresToCamelCase(name, true) + "Method";
        this.idName = methodIdName(name);
        this.in = javaType(proto.getInputType());
        this.outType = javaType(proto.getOutputType());
        this.clientStreaming = proto.getClientStreaming();
        this.serverStreaming = proto.getServerStreaming();
        this.doc = comment(file, List.of(SERVICE_FIELD, serviceIndex, METHOD_FIELD, index));
      }

      String methodType() {
        if (clientStreaming && serverStreaming) {
          return "BIDI_STREAMING";
        }
        if (clientStreaming) {
          return "CLIENT_STREAMING";
        }
        return serverStreaming ? "SERVER_STREAMING" : "UNARY";
      }

      String descriptorType() {
        return "io.grpc.MethodDescriptor<" + in + ",\n      " + outType + ">";
      }

      boolean deprecated() {
        return proto.getOptions().getDeprecated();
      }
    }

    String write() {
      String pkg = javaPackage(file);
      String serviceName = (file.getPackage().isEmpty() ? "" : file.getPackage() + ".")
          + service.getName();
      out.append("// Generated by clients/java/codegen/GrpcJavaGenerator.java (grpc-java layout).")
          .append("  DO NOT EDIT!\n");
      out.append("// source: ").append(file.getName()).append("\n\n");
      if (!pkg.isEmpty()) {
        out.append("package ").append(pkg).append(";\n\n");
      }
      out.append("import static io.grpc.MethodDescriptor.generateFullMethodName;\n\n");
      javadoc(out, "", comment(file, List.of(SERVICE_FIELD, serviceIndex)));
      out.append("@io.grpc.stub.annotations.GrpcGenerated\n");
      if (service.getOptions().getDeprecated()) {
        out.append("@java.lang.Deprecated\n");
      }
      out.append("public final class ").append(className).append(" {\n\n");
      out.append("  private ").append(className).append("() {}\n\n");
      out.append("  public static final java.lang.String SERVICE_NAME = \"")
          .append(serviceName).append("\";\n\n");
      out.append("  // Static method descriptors that strictly reflect the proto.\n");
      for (Method m : methods) {
        writeMethodDescriptor(m);
      }
      writeStubFactories();
      writeAsyncService();
      writeImplBase();
      writeStub("Stub", "AbstractAsyncStub", "A stub to allow clients to do asynchronous rpc calls");
      writeStub("BlockingStub", "AbstractBlockingStub",
          "A stub to allow clients to do synchronous rpc calls");
      writeStub("FutureStub", "AbstractFutureStub",
          "A stub to allow clients to do ListenableFuture-style rpc calls");
      writeMethodHandlers();
      writeBindService();
      writeDescriptorSuppliers();
      writeServiceDescriptor();
      out.append("}\n");
      return out.toString();
    }

    private void writeMethodDescriptor(Method m) {
      String field = m.getter;
      out.append("  private static volatile ").append(m.descriptorType()).append(" ")
          .append(field).append(";\n\n");
      out.append("  @io.grpc.stub.annotations.RpcMethod(\n");
      out.append("      fullMethodName = SERVICE_NAME + '/' + \"").append(m.name).append("\",\n");
      out.append("      requestType = ").append(m.in).append(".class,\n");
      out.append("      responseType = ").append(m.outType).append(".class,\n");
      out.append("      methodType = io.grpc.MethodDescriptor.MethodType.")
          .append(m.methodType()).append(")\n");
      out.append("  public static ").append(m.descriptorType()).append(" ").append(m.getter)
          .append("() {\n");
      out.append("    ").append(m.descriptorType()).append(" ").append(field).append(";\n");
      out.append("    if ((").append(field).append(" = ").append(className).append(".")
          .append(field).append(") == null) {\n");
      out.append("      synchronized (").append(className).append(".class) {\n");
      out.append("        if ((").append(field).append(" = ").append(className).append(".")
          .append(field).append(") == null) {\n");
      out.append("          ").append(className).append(".").append(field).append(" = ")
          .append(field).append(" =\n");
      out.append("              io.grpc.MethodDescriptor.<").append(m.in).append(", ")
          .append(m.outType).append(">newBuilder()\n");
      out.append("              .setType(io.grpc.MethodDescriptor.MethodType.")
          .append(m.methodType()).append(")\n");
      out.append("              .setFullMethodName(generateFullMethodName(SERVICE_NAME, \"")
          .append(m.name).append("\"))\n");
      out.append("              .setSampledToLocalTracing(true)\n");
      out.append("              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(\n");
      out.append("                  ").append(m.in).append(".getDefaultInstance()))\n");
      out.append("              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(\n");
      out.append("                  ").append(m.outType).append(".getDefaultInstance()))\n");
      out.append("              .setSchemaDescriptor(new ").append(service.getName())
          .append("MethodDescriptorSupplier(\"").append(m.name).append("\"))\n");
      out.append("              .build();\n");
      out.append("        }\n");
      out.append("      }\n");
      out.append("    }\n");
      out.append("    return ").append(field).append(";\n");
      out.append("  }\n\n");
    }

    private void writeStubFactories() {
      String[][] kinds = {
          {"Stub", "newStub", "Creates a new async stub that supports all call types for the service"},
          {"BlockingStub", "newBlockingStub",
              "Creates a new blocking-style stub that supports unary and streaming output calls on the service"},
          {"FutureStub", "newFutureStub",
              "Creates a new ListenableFuture-style stub that supports unary calls on the service"},
      };
      for (String[] kind : kinds) {
        String stub = service.getName() + kind[0];
        out.append("  /**\n");
        out.append("   * ").append(kind[2]).append("\n");
        out.append("   */\n");
        out.append("  public static ").append(stub).append(" ").append(kind[1])
            .append("(io.grpc.Channel channel) {\n");
        out.append("    io.grpc.stub.AbstractStub.StubFactory<").append(stub).append("> factory =\n");
        out.append("      new io.grpc.stub.AbstractStub.StubFactory<").append(stub).append(">() {\n");
        out.append("        @java.lang.Override\n");
        out.append("        public ").append(stub)
            .append(" newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {\n");
        out.append("          return new ").append(stub).append("(channel, callOptions);\n");
        out.append("        }\n");
        out.append("      };\n");
        out.append("    return ").append(stub).append(".newStub(factory, channel);\n");
        out.append("  }\n\n");
      }
    }

    private void serverSignature(Method m, String indent, String modifiers) {
      javadoc(out, indent, m.doc);
      if (m.deprecated()) {
        out.append(indent).append("@java.lang.Deprecated\n");
      }
      if (m.clientStreaming) {
        out.append(indent).append(modifiers).append("io.grpc.stub.StreamObserver<").append(m.in)
            .append("> ").append(m.javaName).append("(\n");
        out.append(indent).append("    io.grpc.stub.StreamObserver<").append(m.outType)
            .append("> responseObserver)");
      } else {
        out.append(indent).append(modifiers).append("void ").append(m.javaName).append("(")
            .append(m.in).append(" request,\n");
        out.append(indent).append("    io.grpc.stub.StreamObserver<").append(m.outType)
            .append("> responseObserver)");
      }
    }

    private void writeAsyncService() {
      javadoc(out, "  ", comment(file, List.of(SERVICE_FIELD, serviceIndex)));
      out.append("  public interface AsyncService {\n");
      for (Method m : methods) {
        out.append('\n');
        serverSignature(m, "    ", "default ");
        out.append(" {\n");
        if (m.clientStreaming) {
          out.append("      return io.grpc.stub.ServerCalls.asyncUnimplementedStreamingCall(")
              .append(m.getter).append("(), responseObserver);\n");
        } else {
          out.append("      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(")
              .append(m.getter).append("(), responseObserver);\n");
        }
        out.append("    }\n");
      }
      out.append("  }\n\n");
    }

    private void writeImplBase() {
      out.append("  /**\n");
      out.append("   * Base class for the server implementation of the service ")
          .append(service.getName()).append(".\n");
      String doc = comment(file, List.of(SERVICE_FIELD, serviceIndex));
      if (!doc.isBlank()) {
        StringBuilder inner = new StringBuilder();
        javadoc(inner, "", doc);
        String[] lines = inner.toString().split("\n");
        for (int i = 1; i < lines.length - 1; i++) {
          out.append("  ").append(lines[i]).append('\n');
        }
      }
      out.append("   */\n");
      out.append("  public static abstract class ").append(service.getName()).append("ImplBase\n");
      out.append("      implements io.grpc.BindableService, AsyncService {\n\n");
      out.append("    @java.lang.Override public final io.grpc.ServerServiceDefinition bindService() {\n");
      out.append("      return ").append(className).append(".bindService(this);\n");
      out.append("    }\n");
      out.append("  }\n\n");
    }

    private void writeStub(String suffix, String base, String summary) {
      String stub = service.getName() + suffix;
      boolean blocking = suffix.equals("BlockingStub");
      boolean future = suffix.equals("FutureStub");
      out.append("  /**\n");
      out.append("   * ").append(summary).append(" to service ").append(service.getName())
          .append(".\n");
      String doc = comment(file, List.of(SERVICE_FIELD, serviceIndex));
      if (!doc.isBlank()) {
        StringBuilder inner = new StringBuilder();
        javadoc(inner, "", doc);
        String[] lines = inner.toString().split("\n");
        for (int i = 1; i < lines.length - 1; i++) {
          out.append("  ").append(lines[i]).append('\n');
        }
      }
      out.append("   */\n");
      out.append("  public static final class ").append(stub).append("\n");
      out.append("      extends io.grpc.stub.").append(base).append("<").append(stub).append("> {\n");
      out.append("    private ").append(stub)
          .append("(\n        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {\n");
      out.append("      super(channel, callOptions);\n");
      out.append("    }\n\n");
      out.append("    @java.lang.Override\n");
      out.append("    protected ").append(stub)
          .append(" build(\n        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {\n");
      out.append("      return new ").append(stub).append("(channel, callOptions);\n");
      out.append("    }\n");
      for (Method m : methods) {
        if (blocking && m.clientStreaming) {
          continue;
        }
        if (future && (m.clientStreaming || m.serverStreaming)) {
          continue;
        }
        out.append('\n');
        if (blocking) {
          javadoc(out, "    ", m.doc);
          if (m.deprecated()) {
            out.append("    @java.lang.Deprecated\n");
          }
          if (m.serverStreaming) {
            out.append("    public java.util.Iterator<").append(m.outType).append("> ")
                .append(m.javaName).append("(\n        ").append(m.in).append(" request) {\n");
            out.append("      return io.grpc.stub.ClientCalls.blockingServerStreamingCall(\n");
          } else {
            out.append("    public ").append(m.outType).append(" ").append(m.javaName)
                .append("(").append(m.in).append(" request) {\n");
            out.append("      return io.grpc.stub.ClientCalls.blockingUnaryCall(\n");
          }
          out.append("          getChannel(), ").append(m.getter)
              .append("(), getCallOptions(), request);\n");
          out.append("    }\n");
        } else if (future) {
          javadoc(out, "    ", m.doc);
          if (m.deprecated()) {
            out.append("    @java.lang.Deprecated\n");
          }
          out.append("    public com.google.common.util.concurrent.ListenableFuture<")
              .append(m.outType).append("> ").append(m.javaName).append("(\n        ")
              .append(m.in).append(" request) {\n");
          out.append("      return io.grpc.stub.ClientCalls.futureUnaryCall(\n");
          out.append("          getChannel().newCall(").append(m.getter)
              .append("(), getCallOptions()), request);\n");
          out.append("    }\n");
        } else {
          serverSignature(m, "    ", "public ");
          out.append(" {\n");
          String call;
          if (m.clientStreaming && m.serverStreaming) {
            call = "asyncBidiStreamingCall";
          } else if (m.clientStreaming) {
            call = "asyncClientStreamingCall";
          } else if (m.serverStreaming) {
            call = "asyncServerStreamingCall";
          } else {
            call = "asyncUnaryCall";
          }
          if (m.clientStreaming) {
            out.append("      return io.grpc.stub.ClientCalls.").append(call).append("(\n");
            out.append("          getChannel().newCall(").append(m.getter)
                .append("(), getCallOptions()), responseObserver);\n");
          } else {
            out.append("      io.grpc.stub.ClientCalls.").append(call).append("(\n");
            out.append("          getChannel().newCall(").append(m.getter)
                .append("(), getCallOptions()), request, responseObserver);\n");
          }
          out.append("    }\n");
        }
      }
      out.append("  }\n\n");
    }

    private void writeMethodHandlers() {
      for (Method m : methods) {
        out.append("  private static final int ").append(m.idName).append(" = ").append(m.index)
            .append(";\n");
      }
      out.append('\n');
      out.append("  private static final class MethodHandlers<Req, Resp> implements\n");
      out.append("      io.grpc.stub.ServerCalls.UnaryMethod<Req, Resp>,\n");
      out.append("      io.grpc.stub.ServerCalls.ServerStreamingMethod<Req, Resp>,\n");
      out.append("      io.grpc.stub.ServerCalls.ClientStreamingMethod<Req, Resp>,\n");
      out.append("      io.grpc.stub.ServerCalls.BidiStreamingMethod<Req, Resp> {\n");
      out.append("    private final AsyncService serviceImpl;\n");
      out.append("    private final int methodId;\n\n");
      out.append("    MethodHandlers(AsyncService serviceImpl, int methodId) {\n");
      out.append("      this.serviceImpl = serviceImpl;\n");
      out.append("      this.methodId = methodId;\n");
      out.append("    }\n\n");
      out.append("    @java.lang.Override\n");
      out.append("    @java.lang.SuppressWarnings(\"unchecked\")\n");
      out.append("    public void invoke(Req request, io.grpc.stub.StreamObserver<Resp> responseObserver) {\n");
      out.append("      switch (methodId) {\n");
      for (Method m : methods) {
        if (m.clientStreaming) {
          continue;
        }
        out.append("        case ").append(m.idName).append(":\n");
        out.append("          serviceImpl.").append(m.javaName).append("((").append(m.in)
            .append(") request,\n");
        out.append("              (io.grpc.stub.StreamObserver<").append(m.outType)
            .append(">) responseObserver);\n");
        out.append("          break;\n");
      }
      out.append("        default:\n");
      out.append("          throw new AssertionError();\n");
      out.append("      }\n");
      out.append("    }\n\n");
      out.append("    @java.lang.Override\n");
      out.append("    @java.lang.SuppressWarnings(\"unchecked\")\n");
      out.append("    public io.grpc.stub.StreamObserver<Req> invoke(\n");
      out.append("        io.grpc.stub.StreamObserver<Resp> responseObserver) {\n");
      out.append("      switch (methodId) {\n");
      for (Method m : methods) {
        if (!m.clientStreaming) {
          continue;
        }
        out.append("        case ").append(m.idName).append(":\n");
        out.append("          return (io.grpc.stub.StreamObserver<Req>) serviceImpl.")
            .append(m.javaName).append("(\n");
        out.append("              (io.grpc.stub.StreamObserver<").append(m.outType)
            .append(">) responseObserver);\n");
      }
      out.append("        default:\n");
      out.append("          throw new AssertionError();\n");
      out.append("      }\n");
      out.append("    }\n");
      out.append("  }\n\n");
    }

    private void writeBindService() {
      out.append("  public static final io.grpc.ServerServiceDefinition bindService(AsyncService service) {\n");
      out.append("    return io.grpc.ServerServiceDefinition.builder(getServiceDescriptor())\n");
      for (Method m : methods) {
        String call;
        if (m.clientStreaming && m.serverStreaming) {
          call = "asyncBidiStreamingCall";
        } else if (m.clientStreaming) {
          call = "asyncClientStreamingCall";
        } else if (m.serverStreaming) {
          call = "asyncServerStreamingCall";
        } else {
          call = "asyncUnaryCall";
        }
        out.append("        .addMethod(\n");
        out.append("          ").append(m.getter).append("(),\n");
        out.append("          io.grpc.stub.ServerCalls.").append(call).append("(\n");
        out.append("            new MethodHandlers<\n");
        out.append("              ").append(m.in).append(",\n");
        out.append("              ").append(m.outType).append(">(\n");
        out.append("                service, ").append(m.idName).append(")))\n");
      }
      out.append("        .build();\n");
      out.append("  }\n\n");
    }

    private void writeDescriptorSuppliers() {
      String name = service.getName();
      String outer = javaPackage(file).isEmpty()
          ? outerClassName(file)
          : javaPackage(file) + "." + outerClassName(file);
      out.append("  private static abstract class ").append(name).append("BaseDescriptorSupplier\n");
      out.append("      implements io.grpc.protobuf.ProtoFileDescriptorSupplier, ")
          .append("io.grpc.protobuf.ProtoServiceDescriptorSupplier {\n");
      out.append("    ").append(name).append("BaseDescriptorSupplier() {}\n\n");
      out.append("    @java.lang.Override\n");
      out.append("    public com.google.protobuf.Descriptors.FileDescriptor getFileDescriptor() {\n");
      out.append("      return ").append(outer).append(".getDescriptor();\n");
      out.append("    }\n\n");
      out.append("    @java.lang.Override\n");
      out.append("    public com.google.protobuf.Descriptors.ServiceDescriptor getServiceDescriptor() {\n");
      out.append("      return getFileDescriptor().findServiceByName(\"").append(name).append("\");\n");
      out.append("    }\n");
      out.append("  }\n\n");
      out.append("  private static final class ").append(name).append("FileDescriptorSupplier\n");
      out.append("      extends ").append(name).append("BaseDescriptorSupplier {\n");
      out.append("    ").append(name).append("FileDescriptorSupplier() {}\n");
      out.append("  }\n\n");
      out.append("  private static final class ").append(name).append("MethodDescriptorSupplier\n");
      out.append("      extends ").append(name).append("BaseDescriptorSupplier\n");
      out.append("      implements io.grpc.protobuf.ProtoMethodDescriptorSupplier {\n");
      out.append("    private final java.lang.String methodName;\n\n");
      out.append("    ").append(name)
          .append("MethodDescriptorSupplier(java.lang.String methodName) {\n");
      out.append("      this.methodName = methodName;\n");
      out.append("    }\n\n");
      out.append("    @java.lang.Override\n");
      out.append("    public com.google.protobuf.Descriptors.MethodDescriptor getMethodDescriptor() {\n");
      out.append("      return getServiceDescriptor().findMethodByName(methodName);\n");
      out.append("    }\n");
      out.append("  }\n\n");
    }

    private void writeServiceDescriptor() {
      out.append("  private static volatile io.grpc.ServiceDescriptor serviceDescriptor;\n\n");
      out.append("  public static io.grpc.ServiceDescriptor getServiceDescriptor() {\n");
      out.append("    io.grpc.ServiceDescriptor result = serviceDescriptor;\n");
      out.append("    if (result == null) {\n");
      out.append("      synchronized (").append(className).append(".class) {\n");
      out.append("        result = serviceDescriptor;\n");
      out.append("        if (result == null) {\n");
      out.append("          serviceDescriptor = result = io.grpc.ServiceDescriptor.newBuilder(SERVICE_NAME)\n");
      out.append("              .setSchemaDescriptor(new ").append(service.getName())
          .append("FileDescriptorSupplier())\n");
      for (Method m : methods) {
        out.append("              .addMethod(").append(m.getter).append("())\n");
      }
      out.append("              .build();\n");
      out.append("        }\n");
      out.append("      }\n");
      out.append("    }\n");
      out.append("    return result;\n");
      out.append("  }\n");
    }
  }
}
