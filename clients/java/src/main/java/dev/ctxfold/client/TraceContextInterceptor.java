package dev.ctxfold.client;

import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.opentelemetry.api.GlobalOpenTelemetry;
import io.opentelemetry.api.OpenTelemetry;
import io.opentelemetry.api.trace.propagation.W3CTraceContextPropagator;
import io.opentelemetry.context.Context;
import io.opentelemetry.context.propagation.TextMapPropagator;
import io.opentelemetry.context.propagation.TextMapSetter;

/**
 * Puts the W3C trace context ({@code traceparent}, {@code tracestate}) of the active
 * OpenTelemetry context into every call's metadata, so the server's spans join the caller's trace.
 *
 * <p>An explicit traceparent set with {@link CtxfoldClient#withTraceparent(String)} wins. Otherwise
 * the propagators of the {@link OpenTelemetry} given to the builder are used, else those of
 * {@link GlobalOpenTelemetry} when it has been set, else the plain W3C propagator (which injects
 * nothing while no span is active).
 */
public final class TraceContextInterceptor implements ClientInterceptor {
  static final CallOptions.Key<String> TRACEPARENT = CallOptions.Key.create("ctxfold-traceparent");
  static final CallOptions.Key<String> TRACESTATE = CallOptions.Key.create("ctxfold-tracestate");

  private static final Metadata.Key<String> TRACEPARENT_KEY =
      Metadata.Key.of("traceparent", Metadata.ASCII_STRING_MARSHALLER);
  private static final Metadata.Key<String> TRACESTATE_KEY =
      Metadata.Key.of("tracestate", Metadata.ASCII_STRING_MARSHALLER);

  private static final TextMapSetter<Metadata> SETTER = (carrier, key, value) -> {
    if (carrier == null || value == null) {
      return;
    }
    Metadata.Key<String> k = Metadata.Key.of(key, Metadata.ASCII_STRING_MARSHALLER);
    carrier.removeAll(k);
    carrier.put(k, value);
  };

  private final OpenTelemetry openTelemetry;

  /** @param openTelemetry whose propagators to use; null = global if set, else W3C */
  public TraceContextInterceptor(OpenTelemetry openTelemetry) {
    this.openTelemetry = openTelemetry;
  }

  private TextMapPropagator propagator() {
    if (openTelemetry != null) {
      return openTelemetry.getPropagators().getTextMapPropagator();
    }
    if (GlobalOpenTelemetry.isSet()) {
      return GlobalOpenTelemetry.get().getPropagators().getTextMapPropagator();
    }
    return W3CTraceContextPropagator.getInstance();
  }

  @Override
  public <ReqT, RespT> ClientCall<ReqT, RespT> interceptCall(
      MethodDescriptor<ReqT, RespT> method, CallOptions callOptions, Channel next) {
    String explicitParent = callOptions.getOption(TRACEPARENT);
    String explicitState = callOptions.getOption(TRACESTATE);
    // Read the context on the calling thread: start() may run elsewhere for async stubs.
    Context context = Context.current();
    return new ForwardingClientCall.SimpleForwardingClientCall<>(next.newCall(method, callOptions)) {
      @Override
      public void start(Listener<RespT> responseListener, Metadata headers) {
        if (explicitParent != null && !explicitParent.isEmpty()) {
          headers.removeAll(TRACEPARENT_KEY);
          headers.put(TRACEPARENT_KEY, explicitParent);
          if (explicitState != null && !explicitState.isEmpty()) {
            headers.removeAll(TRACESTATE_KEY);
            headers.put(TRACESTATE_KEY, explicitState);
          }
        } else {
          propagator().inject(context, headers, SETTER);
        }
        super.start(responseListener, headers);
      }
    };
  }
}
