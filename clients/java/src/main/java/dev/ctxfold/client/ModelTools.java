package dev.ctxfold.client;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParseException;
import com.google.gson.JsonParser;
import com.google.gson.JsonPrimitive;
import dev.ctxfold.v1.ErrorReason;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * Tools the model can call: {@code read_tool_result} (page through any result whose
 * {@code result_ref} it sees in the view, the folded-results index included) and
 * {@code context_budget} (how full the window is).
 *
 * <p>{@link #definitions(ToolFormat)} gives their definitions to put in the provider request's
 * {@code tools}; {@link CtxfoldClient#dispatchToolCall} answers a call with the text to append as
 * its tool result. This class is the I/O-free part: parsing a call and writing the answers.
 */
public final class ModelTools {
  /** The name of the tool that reads a stored tool result page by page. */
  public static final String READ_TOOL_RESULT = "read_tool_result";
  /** The name of the tool that reports how full the context window is. */
  public static final String CONTEXT_BUDGET = "context_budget";

  private static final String READ_DESCRIPTION = "Read a stored tool result by its result_ref, one page at a time. "
      + "Use it when the context shows a result_ref for output that was shortened or folded away, "
      + "including the folded-results index.";
  private static final String BUDGET_DESCRIPTION = "Report how full the context window is: the tokens of the "
      + "current context, the level at which older history is folded into a summary, and the hard limit.";

  /** The server's answers to a model's mistake, which the model can act on (other failures are thrown). */
  static final Set<ErrorReason> MODEL_MISTAKES = EnumSet.of(
      ErrorReason.RESULT_REF_REQUIRED,
      ErrorReason.RESULT_REF_NOT_FOUND,
      ErrorReason.RESULT_REF_AMBIGUOUS,
      ErrorReason.OFFSET_OUT_OF_RANGE,
      ErrorReason.OFFSET_NOT_CHAR_BOUNDARY,
      ErrorReason.INVALID_REQUEST);

  private ModelTools() {}

  private static Map<String, Object> readParameters() {
    Map<String, Object> resultRef = new LinkedHashMap<>();
    resultRef.put("type", "string");
    resultRef.put("description", "The result_ref named in the context.");
    Map<String, Object> offset = new LinkedHashMap<>();
    offset.put("type", "integer");
    offset.put("minimum", 0L);
    offset.put("default", 0L);
    offset.put("description", "UTF-8 byte offset to read from; each page names the next offset.");
    Map<String, Object> properties = new LinkedHashMap<>();
    properties.put("result_ref", resultRef);
    properties.put("offset", offset);
    Map<String, Object> parameters = new LinkedHashMap<>();
    parameters.put("type", "object");
    parameters.put("properties", properties);
    parameters.put("required", List.of("result_ref"));
    return parameters;
  }

  private static Map<String, Object> budgetParameters() {
    Map<String, Object> parameters = new LinkedHashMap<>();
    parameters.put("type", "object");
    parameters.put("properties", new LinkedHashMap<>());
    return parameters;
  }

  /**
   * The definitions of {@code read_tool_result} and {@code context_budget} in a provider's tool
   * format, as JSON-shaped maps (fresh, mutable copies) to add to the request's {@code tools}.
   */
  public static List<Map<String, Object>> definitions(ToolFormat format) {
    List<Map<String, Object>> out = new ArrayList<>();
    out.add(definition(format, READ_TOOL_RESULT, READ_DESCRIPTION, readParameters()));
    out.add(definition(format, CONTEXT_BUDGET, BUDGET_DESCRIPTION, budgetParameters()));
    return out;
  }

  private static Map<String, Object> definition(
      ToolFormat format, String name, String description, Map<String, Object> parameters) {
    Map<String, Object> tool = new LinkedHashMap<>();
    switch (format) {
      case OPENAI_CHAT -> {
        Map<String, Object> function = new LinkedHashMap<>();
        function.put("name", name);
        function.put("description", description);
        function.put("parameters", parameters);
        tool.put("type", "function");
        tool.put("function", function);
      }
      case OPENAI_RESPONSES -> {
        tool.put("type", "function");
        tool.put("name", name);
        tool.put("description", description);
        tool.put("parameters", parameters);
        // Responses function tools default to strict, whose schemas cannot have optional fields (offset).
        tool.put("strict", false);
      }
      case ANTHROPIC -> {
        tool.put("name", name);
        tool.put("description", description);
        tool.put("input_schema", parameters);
      }
      default -> throw new IllegalStateException("a ToolFormat without a definition: " + format);
    }
    return tool;
  }

  /**
   * The tools a provider request for {@code view} offers (what the adapters send): the session's
   * tools in {@code format}, then the {@code read_tool_result} definition when the view hides a
   * result ({@link View#hidesResults()}) and no tool of that name is among them.
   *
   * @param tools the tools given to the session: JSON-shaped values (maps, lists), or null for none
   */
  public static List<Object> offered(List<?> tools, View view, ToolFormat format) {
    List<Object> out = new ArrayList<>(tools == null ? List.of() : tools);
    if (view.hidesResults() && out.stream().noneMatch(tool -> READ_TOOL_RESULT.equals(toolName(tool)))) {
      out.add(definitions(format).get(0));
    }
    return out;
  }

  /** The name of a tool definition in any of the three formats. */
  private static Object toolName(Object tool) {
    if (!(tool instanceof Map<?, ?> definition)) {
      return null;
    }
    return definition.get("function") instanceof Map<?, ?> function ? function.get("name") : definition.get("name");
  }

  /** True when {@code name} is one of the tools defined here (the agent runs all others itself). */
  public static boolean handles(String name) {
    return READ_TOOL_RESULT.equals(name) || CONTEXT_BUDGET.equals(name);
  }

  /** A parsed call of one of these tools. */
  sealed interface Call permits ReadCall, BudgetCall, BadCall {}

  record ReadCall(String resultRef, long offset) implements Call {}

  record BudgetCall() implements Call {}

  /** A call the model got wrong; {@code answer} tells it what to fix. */
  record BadCall(String answer) implements Call {}

  /** The call of a ctxfold tool; null when {@code name} is not one. */
  static Call parse(String name, String arguments) {
    if (!handles(name)) {
      return null;
    }
    JsonElement decoded;
    try {
      decoded = JsonParser.parseString(arguments == null || arguments.isBlank() ? "{}" : arguments);
    } catch (JsonParseException e) {
      return new BadCall("error: invalid arguments: not JSON (" + e.getMessage() + ")");
    }
    if (!decoded.isJsonObject()) {
      return new BadCall("error: invalid arguments: expected a JSON object");
    }
    if (CONTEXT_BUDGET.equals(name)) {
      return new BudgetCall();
    }
    JsonObject args = decoded.getAsJsonObject();
    JsonElement ref = args.get("result_ref");
    if (ref == null || !ref.isJsonPrimitive() || !ref.getAsJsonPrimitive().isString() || ref.getAsString().isEmpty()) {
      return new BadCall("error: invalid arguments: \"result_ref\" (a string from the context) is required");
    }
    JsonElement offset = args.get("offset");
    long start = 0;
    if (offset != null && !offset.isJsonNull()) {
      if (!isNonNegativeInteger(offset)) {
        return new BadCall("error: invalid arguments: \"offset\" must be a non-negative integer");
      }
      start = offset.getAsLong();
    }
    return new ReadCall(ref.getAsString(), start);
  }

  private static boolean isNonNegativeInteger(JsonElement value) {
    if (!value.isJsonPrimitive() || !value.getAsJsonPrimitive().isNumber()) {
      return false;
    }
    JsonPrimitive number = value.getAsJsonPrimitive();
    try {
      return new java.math.BigDecimal(number.getAsString()).stripTrailingZeros().scale() <= 0
          && number.getAsLong() >= 0;
    } catch (NumberFormatException e) {
      return false;
    }
  }

  /** The page's text, with a footer naming the next offset when the result continues. */
  static String pageAnswer(ToolResultPage page) {
    if (page.complete()) {
      return page.data();
    }
    return page.data() + "\n\n[read_tool_result: bytes " + page.offset() + "-" + page.nextOffset() + " of "
        + page.totalBytes() + "; call read_tool_result with result_ref \"" + page.resultRef() + "\" and offset "
        + page.nextOffset() + " for more]";
  }

  /** The answer to a call the server refused as the model's mistake; other failures are rethrown. */
  static String errorAnswer(CtxfoldException error) {
    if (!MODEL_MISTAKES.contains(error.errorReason())) {
      throw error;
    }
    return "error: " + error.reason() + ": " + error.statusMessage();
  }

  /** The context_budget answer for the last view this client prepared for the session. */
  static String budgetAnswer(View view) {
    if (view == null) {
      return "error: no context prepared by this client yet";
    }
    Map<String, Object> budget = new LinkedHashMap<>();
    budget.put("estimated_tokens", view.estimatedTokens());
    budget.put("trigger_tokens", view.triggerTokens());
    budget.put("hard_limit_tokens", view.hardLimitTokens());
    return JsonText.write(budget);
  }
}
