package dev.ctxfold.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.ToNumberPolicy;
import com.google.gson.reflect.TypeToken;
import com.google.protobuf.Descriptors.EnumValueDescriptor;
import com.google.protobuf.Descriptors.FieldDescriptor;
import com.google.protobuf.MessageOrBuilder;
import com.google.protobuf.Timestamp;
import com.google.protobuf.util.Timestamps;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.regex.Pattern;

/**
 * The engine of the language-neutral conformance scenarios (clients/conformance, format in
 * clients/README.md): value generation and {@code $name} substitution, the canonical JSON form of
 * results, path lookup and matchers. {@link ConformanceTest} binds the operations to the SDK.
 */
final class Conformance {
  static final Gson JSON = new GsonBuilder()
      .setObjectToNumberStrategy(ToNumberPolicy.LONG_OR_DOUBLE)
      .disableHtmlEscaping()
      .serializeNulls()
      .create();

  private Conformance() {}

  /** clients/conformance: -Dctxfold.client.dir (the Maven basedir) is clients/java. */
  static Path dir() {
    String base = System.getProperty("ctxfold.client.dir", ".");
    return Paths.get(base).toAbsolutePath().normalize().resolveSibling("conformance");
  }

  static Object parse(String json) {
    return JSON.fromJson(json, Object.class);
  }

  static Map<String, Object> load(Path file) {
    try {
      return JSON.fromJson(Files.readString(file), new TypeToken<Map<String, Object>>() { }.getType());
    } catch (IOException e) {
      throw new java.io.UncheckedIOException(e);
    }
  }

  // ---- canonical JSON -------------------------------------------------------------------------

  /**
   * The canonical form of a protobuf message: snake_case names, enums by name, 64-bit integers as
   * numbers, every field present (unset messages as null), timestamps as RFC 3339.
   */
  static Object canonical(MessageOrBuilder message) {
    if (message instanceof Timestamp) {
      return Timestamps.toString((Timestamp) message);
    }
    Map<String, Object> out = new LinkedHashMap<>();
    for (FieldDescriptor field : message.getDescriptorForType().getFields()) {
      if (field.isRepeated()) {
        List<Object> items = new ArrayList<>();
        for (int i = 0; i < message.getRepeatedFieldCount(field); i++) {
          items.add(value(field, message.getRepeatedField(field, i)));
        }
        out.put(field.getName(), items);
      } else if (field.getJavaType() == FieldDescriptor.JavaType.MESSAGE && !message.hasField(field)) {
        out.put(field.getName(), null);
      } else {
        out.put(field.getName(), value(field, message.getField(field)));
      }
    }
    return out;
  }

  private static Object value(FieldDescriptor field, Object value) {
    switch (field.getJavaType()) {
      case MESSAGE:
        return canonical((MessageOrBuilder) value);
      case ENUM:
        return ((EnumValueDescriptor) value).getName();
      case INT:
      case LONG:
        return ((Number) value).longValue();
      case FLOAT:
      case DOUBLE:
        return ((Number) value).doubleValue();
      default:
        return value;
    }
  }

  /** Lists and maps of canonical values, recursively; protobuf messages through {@link #canonical}. */
  static Object canonicalValue(Object value) {
    if (value instanceof MessageOrBuilder) {
      return canonical((MessageOrBuilder) value);
    }
    if (value instanceof Session session) {
      return canonical(session.toProto());
    }
    if (value instanceof Message message) {
      return canonical(message.toProto());
    }
    if (value instanceof Checkpoint checkpoint) {
      return canonical(checkpoint.toProto());
    }
    if (value instanceof FoldProgress progress) {
      return canonical(progress.toProto());
    }
    if (value instanceof List) {
      List<Object> out = new ArrayList<>();
      for (Object item : (List<?>) value) {
        out.add(canonicalValue(item));
      }
      return out;
    }
    if (value instanceof Map) {
      Map<String, Object> out = new LinkedHashMap<>();
      ((Map<?, ?>) value).forEach((k, v) -> out.put(String.valueOf(k), canonicalValue(v)));
      return out;
    }
    if (value instanceof Integer || value instanceof Short) {
      return ((Number) value).longValue();
    }
    return value;
  }

  // ---- values, substitution, paths, matchers ---------------------------------------------------

  /** {@code value} at a dot-separated path of keys and list indexes; {@code length} is a size. */
  static Object lookup(Object value, String path) {
    if (path.isEmpty()) {
      return value;
    }
    for (String part : path.split("\\.")) {
      if (part.equals("length") && value instanceof List) {
        value = (long) ((List<?>) value).size();
      } else if (part.equals("length") && value instanceof String) {
        value = (long) ((String) value).length();
      } else if (value instanceof List) {
        value = ((List<?>) value).get(Integer.parseInt(part));
      } else if (value instanceof Map) {
        Map<?, ?> map = (Map<?, ?>) value;
        if (!map.containsKey(part)) {
          throw new IllegalArgumentException("no '" + part + "' in " + map.keySet() + " (path " + path + ")");
        }
        value = map.get(part);
      } else {
        throw new IllegalArgumentException("cannot take '" + part + "' of " + value + " (path " + path + ")");
      }
    }
    return value;
  }

  /** Generated values and {@code $name.path} references replaced, recursively. */
  static Object resolve(Object value, Map<String, Object> saved) {
    if (value instanceof String && ((String) value).startsWith("$")) {
      String ref = ((String) value).substring(1);
      int dot = ref.indexOf('.');
      String name = dot < 0 ? ref : ref.substring(0, dot);
      if (!saved.containsKey(name)) {
        throw new IllegalArgumentException("nothing saved as '" + name + "' (have " + saved.keySet() + ")");
      }
      return lookup(saved.get(name), dot < 0 ? "" : ref.substring(dot + 1));
    }
    if (value instanceof List) {
      List<Object> out = new ArrayList<>();
      for (Object item : (List<?>) value) {
        out.add(resolve(item, saved));
      }
      return out;
    }
    if (value instanceof Map) {
      Map<?, ?> map = (Map<?, ?>) value;
      if (map.containsKey("$repeat")) {
        return String.valueOf(map.get("$repeat")).repeat(((Number) map.get("times")).intValue());
      }
      if (map.containsKey("$json")) {
        return JSON.toJson(resolve(map.get("$json"), saved));
      }
      if (map.containsKey("$tool_definitions")) {
        return ModelTools.definitions(ToolFormat.of((String) map.get("$tool_definitions")));
      }
      Map<String, Object> out = new LinkedHashMap<>();
      map.forEach((k, v) -> out.put(String.valueOf(k), resolve(v, saved)));
      return out;
    }
    return value;
  }

  private static boolean same(Object actual, Object expected) {
    if (actual instanceof Number && expected instanceof Number) {
      return ((Number) actual).doubleValue() == ((Number) expected).doubleValue();
    }
    return Objects.equals(actual, expected);
  }

  private static double number(Object value, String where) {
    if (!(value instanceof Number)) {
      fail(where + ": " + value + " is not a number");
    }
    return ((Number) value).doubleValue();
  }

  static void check(Object actual, Object matcher, Map<String, Object> saved, String where) {
    if (matcher instanceof Map && ((Map<?, ?>) matcher).size() == 1) {
      Map.Entry<?, ?> only = ((Map<?, ?>) matcher).entrySet().iterator().next();
      Object expected = only.getValue();
      switch (String.valueOf(only.getKey())) {
        case "contains" -> {
          assertTrue(actual instanceof String && ((String) actual).contains((String) expected),
              where + ": " + actual + " does not contain " + expected);
          return;
        }
        case "matches" -> {
          assertTrue(actual instanceof String && Pattern.compile((String) expected).matcher((String) actual).find(),
              where + ": " + actual + " !~ " + expected);
          return;
        }
        case "gte" -> {
          assertTrue(number(actual, where) >= number(expected, where), where + ": " + actual + " < " + expected);
          return;
        }
        case "lte" -> {
          assertTrue(number(actual, where) <= number(expected, where), where + ": " + actual + " > " + expected);
          return;
        }
        case "present" -> {
          boolean present = !(actual == null || "".equals(actual) || Boolean.FALSE.equals(actual)
              || (actual instanceof Number && ((Number) actual).doubleValue() == 0)
              || (actual instanceof List && ((List<?>) actual).isEmpty())
              || (actual instanceof Map && ((Map<?, ?>) actual).isEmpty()));
          assertEquals(expected, present, where + ": " + actual + " is " + (present ? "" : "not ") + "present");
          return;
        }
        case "equals_saved" -> {
          Object wanted = resolve(expected, saved);
          assertTrue(same(actual, wanted), where + ": " + actual + " != " + wanted + " (" + expected + ")");
          return;
        }
        default -> {
          // A one-key object literal: compared by equality below.
        }
      }
    }
    if (!same(actual, matcher)) {
      assertEquals(JSON.toJson(matcher), JSON.toJson(actual), where);
    }
  }

  static void checkAll(Object result, Map<String, Object> expect, Map<String, Object> saved, String where) {
    for (Map.Entry<String, Object> e : expect.entrySet()) {
      Object actual;
      try {
        actual = lookup(result, e.getKey());
      } catch (RuntimeException missing) {
        if (Map.of("present", false).equals(e.getValue())) {
          continue; // an absent key is not present
        }
        String text = JSON.toJson(result);
        throw new AssertionError(where + " " + e.getKey() + ": " + missing.getMessage() + "; result: "
            + text.substring(0, Math.min(2000, text.length())), missing);
      }
      check(actual, e.getValue(), saved, where + " " + e.getKey());
    }
  }
}
