package dev.ctxfold.client.adapters;

import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.ToNumberPolicy;
import com.google.gson.reflect.TypeToken;
import dev.ctxfold.client.CtxfoldException;
import dev.ctxfold.client.JsonText;
import dev.ctxfold.v1.ErrorReason;
import io.grpc.Status;
import java.util.List;
import java.util.Map;

/** Reading JSON-shaped values (maps from Gson or from the caller) without a schema. */
final class Json {
  static final Gson GSON = new GsonBuilder()
      .setObjectToNumberStrategy(ToNumberPolicy.LONG_OR_DOUBLE)
      .disableHtmlEscaping()
      .create();

  private Json() {}

  static Map<String, Object> parseObject(String json) {
    Map<String, Object> value;
    try {
      value = GSON.fromJson(json, new TypeToken<Map<String, Object>>() { }.getType());
    } catch (RuntimeException e) {
      throw unconvertible("not a JSON object: " + e.getMessage());
    }
    if (value == null) {
      throw unconvertible("not a JSON object: " + json);
    }
    return value;
  }

  /** What an adapter throws for a message or response it cannot convert (clients/README.md). */
  static CtxfoldException unconvertible(String message) {
    return new CtxfoldException(Status.Code.INVALID_ARGUMENT, message, ErrorReason.INVALID_MESSAGE.name(),
        CtxfoldException.CLIENT_DOMAIN, Map.of(), null, null);
  }

  @SuppressWarnings("unchecked")
  static Map<String, Object> object(Map<String, Object> from, String key) {
    Object value = from.get(key);
    return value instanceof Map ? (Map<String, Object>) value : Map.of();
  }

  @SuppressWarnings("unchecked")
  static List<Object> list(Map<String, Object> from, String key) {
    Object value = from.get(key);
    return value instanceof List ? (List<Object>) value : List.of();
  }

  @SuppressWarnings("unchecked")
  static Map<String, Object> asObject(Object value) {
    return value instanceof Map ? (Map<String, Object>) value : Map.of();
  }

  static String string(Map<String, Object> from, String key) {
    Object value = from.get(key);
    return value instanceof String ? (String) value : "";
  }

  static long number(Map<String, Object> from, String key) {
    Object value = from.get(key);
    return value instanceof Number ? ((Number) value).longValue() : 0;
  }

  /** Text parts joined by newlines, empty parts left out. */
  static String join(List<String> parts) {
    return String.join("\n", parts.stream().filter(p -> !p.isEmpty()).toList());
  }

  /** A tool call's arguments as a JSON string: a string as it is, an object written as {@link JsonText} writes. */
  static String arguments(Object value) {
    if (value == null) {
      return "{}";
    }
    return value instanceof String ? (String) value : JsonText.write(value);
  }
}
