package dev.ctxfold.client;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParseException;
import com.google.gson.JsonParser;
import com.google.gson.JsonPrimitive;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.math.MathContext;
import java.math.RoundingMode;
import java.util.Map;

/**
 * The one form of the JSON every ctxfold SDK writes itself (tool schemas, tool call arguments given
 * as objects, Anthropic tool inputs, the context_budget answer): JavaScript's
 * {@code JSON.stringify}, so the four SDKs write the same bytes (clients/README.md, "JSON the SDKs
 * write"). Gson differs: it escapes {@code = ' < > &} by default and U+2028 / U+2029 always, and
 * writes {@code 1.0} for the number 1.
 */
public final class JsonText {
  private JsonText() {}

  /**
   * {@code value} written in the one form: maps (keys in their iteration order), lists and other
   * iterables, strings, numbers, booleans, null, and Gson's {@link JsonElement}s.
   *
   * @throws IllegalArgumentException for a value that is none of these
   */
  public static String write(Object value) {
    StringBuilder out = new StringBuilder();
    write(value, out);
    return out.toString();
  }

  /** JSON text written again in the one form; an {@link IllegalArgumentException} when it is not JSON. */
  public static String normalize(String json) {
    try {
      return write(JsonParser.parseString(json));
    } catch (JsonParseException e) {
      throw new IllegalArgumentException("not JSON: " + e.getMessage(), e);
    }
  }

  private static void write(Object value, StringBuilder out) {
    if (value == null || value instanceof com.google.gson.JsonNull) {
      out.append("null");
    } else if (value instanceof JsonPrimitive primitive) {
      if (primitive.isString()) {
        string(primitive.getAsString(), out);
      } else if (primitive.isBoolean()) {
        out.append(primitive.getAsBoolean());
      } else {
        out.append(literal(primitive.getAsString()));
      }
    } else if (value instanceof JsonObject object) {
      writeEntries(object.entrySet(), out);
    } else if (value instanceof JsonArray array) {
      writeItems(array, out);
    } else if (value instanceof CharSequence text) {
      string(text.toString(), out);
    } else if (value instanceof Boolean flag) {
      out.append(flag);
    } else if (value instanceof Double || value instanceof Float) {
      out.append(number(((Number) value).doubleValue()));
    } else if (value instanceof BigDecimal decimal) {
      out.append(literal(decimal.toString()));
    } else if (value instanceof Number number) {
      out.append(literal(number.toString()));
    } else if (value instanceof Map<?, ?> map) {
      writeEntries(map.entrySet(), out);
    } else if (value instanceof Iterable<?> items) {
      writeItems(items, out);
    } else {
      throw new IllegalArgumentException(value.getClass().getName() + " is not JSON");
    }
  }

  private static void writeEntries(Iterable<? extends Map.Entry<?, ?>> entries, StringBuilder out) {
    out.append('{');
    boolean first = true;
    for (Map.Entry<?, ?> entry : entries) {
      if (!(entry.getKey() instanceof String key)) {
        throw new IllegalArgumentException("JSON object keys are strings, not " + entry.getKey());
      }
      out.append(first ? "" : ",");
      first = false;
      string(key, out);
      out.append(':');
      write(entry.getValue(), out);
    }
    out.append('}');
  }

  private static void writeItems(Iterable<?> items, StringBuilder out) {
    out.append('[');
    boolean first = true;
    for (Object item : items) {
      out.append(first ? "" : ",");
      first = false;
      write(item, out);
    }
    out.append(']');
  }

  /** Escapes only what JSON needs: the quote, the backslash, control characters, lone surrogates. */
  private static void string(String text, StringBuilder out) {
    out.append('"');
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\b' -> out.append("\\b");
        case '\f' -> out.append("\\f");
        case '\n' -> out.append("\\n");
        case '\r' -> out.append("\\r");
        case '\t' -> out.append("\\t");
        default -> {
          boolean paired = Character.isHighSurrogate(c) && i + 1 < text.length()
              && Character.isLowSurrogate(text.charAt(i + 1));
          if (paired) {
            out.append(c).append(text.charAt(++i));
          } else if (c < 0x20 || Character.isSurrogate(c)) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
        }
      }
    }
    out.append('"');
  }

  /** A number literal: an integer's digits, any other number as JavaScript writes it. */
  private static String literal(String text) {
    if (text.indexOf('.') < 0 && text.indexOf('e') < 0 && text.indexOf('E') < 0) {
      return text.equals("-0") ? "0" : text;
    }
    return number(Double.parseDouble(text));
  }

  /** A double as JavaScript writes it (ECMAScript Number::toString): its shortest round-trip digits. */
  static String number(double value) {
    if (Double.isNaN(value) || Double.isInfinite(value)) {
      return "null";
    }
    if (value == 0) {
      return "0";
    }
    BigDecimal exact = new BigDecimal(Math.abs(value));
    BigDecimal shortest = exact;
    for (int precision = 1; precision <= 17; precision++) {
      BigDecimal rounded = exact.round(new MathContext(precision, RoundingMode.HALF_EVEN));
      if (rounded.doubleValue() == Math.abs(value)) {
        shortest = rounded;
        break;
      }
    }
    BigInteger unscaled = shortest.unscaledValue();
    String digits = unscaled.toString();
    int scale = shortest.scale();
    while (digits.length() > 1 && digits.endsWith("0")) {
      digits = digits.substring(0, digits.length() - 1);
      scale--;
    }
    int k = digits.length();
    int n = k - scale; // value = 0.digits × 10^n
    String text;
    if (k <= n && n <= 21) {
      text = digits + "0".repeat(n - k);
    } else if (0 < n && n <= 21) {
      text = digits.substring(0, n) + "." + digits.substring(n);
    } else if (-6 < n && n <= 0) {
      text = "0." + "0".repeat(-n) + digits;
    } else {
      int power = n - 1;
      String mantissa = k == 1 ? digits : digits.charAt(0) + "." + digits.substring(1);
      text = mantissa + "e" + (power > 0 ? "+" : "-") + Math.abs(power);
    }
    return (value < 0 ? "-" : "") + text;
  }
}
