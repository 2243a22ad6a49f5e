package dev.ctxfold.examples;

import dev.ctxfold.client.Calibration;
import dev.ctxfold.client.CtxfoldClient;
import dev.ctxfold.client.Messages;
import dev.ctxfold.client.PrepareOptions;
import dev.ctxfold.client.PreparedContext;
import dev.ctxfold.client.SessionConfig;
import dev.ctxfold.client.Usage;
import dev.ctxfold.v1.FoldProgress;
import dev.ctxfold.v1.Message;
import dev.ctxfold.v1.Role;
import dev.ctxfold.v1.Session;
import dev.ctxfold.v1.ToolCall;
import java.io.PrintStream;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

/**
 * An agent loop on ctxfold: append the user turn, prepare, call the model, append its answer and
 * the tool results, observe usage, repeat until the model answers without tool calls.
 *
 * <p>The "model" is {@link FakeModel}: it lists a few directories with a {@code list_files} tool
 * and then answers. Its tool results are about 1500 characters each and the session's window is
 * 4000 tokens, so the loop runs into the fold trigger and ctxfold folds old history into a summary
 * checkpoint (with progress events) on the way.
 *
 * <pre>
 *   mvn -q compile exec:java -Dexec.mainClass=dev.ctxfold.examples.AgentLoop -Dexec.args=127.0.0.1:50051
 * </pre>
 */
public final class AgentLoop {
  private AgentLoop() {}

  /** What one run did. */
  public record Report(
      String sessionId,
      List<PreparedContext> contexts,
      List<FoldProgress> progress,
      String answer,
      Calibration lastCalibration) {

    /** True when at least one prepare folded history. */
    public boolean folded() {
      return contexts.stream().anyMatch(PreparedContext::folded);
    }
  }

  /** Output tokens reserved per request (the session's max_output_tokens). */
  public static final int MAX_OUTPUT_TOKENS = 256;

  public static final String TOOLS_JSON = "[{\"type\":\"function\",\"function\":{\"name\":\"list_files\","
      + "\"description\":\"List the files of a directory\",\"parameters\":{\"type\":\"object\","
      + "\"properties\":{\"path\":{\"type\":\"string\"}},\"required\":[\"path\"]}}}]";

  /** Runs the loop in a new session with {@code rounds} tool calls; logs to {@code log}. */
  public static Report run(CtxfoldClient client, int rounds, PrintStream log) {
    Session session = client.createSession(SessionConfig.builder()
        .contextWindow(4_000)
        .maxOutputTokens(MAX_OUTPUT_TOKENS)
        .systemPrompt("You are a coding agent. Explore the repository with list_files, then answer.")
        .toolsJson(TOOLS_JSON)
        .model("fake-model")
        .build());
    String sessionId = session.getId();
    log.printf("session %s%n", sessionId);

    List<PreparedContext> contexts = new ArrayList<>();
    List<FoldProgress> progress = new ArrayList<>();
    FakeModel model = new FakeModel(rounds);
    Calibration calibration = null;

    // 1. The user turn goes in with the first prepare.
    List<Message> pending = List.of(Messages.user("Find where the retry policy of the HTTP client is configured."));
    while (true) {
      // 2. Prepare: append what happened since the last request, let ctxfold maintain the context.
      PreparedContext ctx = client.prepare(sessionId, PrepareOptions.builder()
          .append(pending)
          .onProgress(p -> {
            progress.add(p);
            log.printf("  fold: %s pass %d/%d %d -> %d tokens %s%n", p.getStage(), p.getPassIndex(),
                p.getPassesPlanned(), p.getTokensBefore(), p.getTokensAfter(), p.getMessage());
          })
          .build());
      contexts.add(ctx);
      log.printf("view v%d: %d messages, ~%d tokens, %s%s%n", ctx.viewVersion(), ctx.messages().size(),
          ctx.estimatedTokens(), ctx.action(), ctx.delta() ? " (delta " + ctx.received().size() + ")" : "");

      // 3. Call the model with the full view.
      FakeModel.Reply reply = model.complete(ctx.messages());

      // 4. Tell ctxfold what the provider billed (calibrates its estimates). A real agent passes
      //    the provider's usage; the fake one bills the estimate less the reserved output tokens,
      //    and the stable prefix as cached.
      long input = Math.max(0, ctx.estimatedTokens() - MAX_OUTPUT_TOKENS);
      long cached = 0;
      for (int i = 0; i < ctx.stablePrefixMessages() && i < ctx.messages().size(); i++) {
        cached += ctx.messages().get(i).getTokens();
      }
      calibration = client.observeUsage(sessionId, ctx,
          new Usage(input, Math.min(cached, input), reply.outputTokens(), reply.finishReason()));

      // 5. No tool calls: the answer ends the turn.
      if (reply.message().getToolCallsCount() == 0) {
        client.append(sessionId, reply.message());
        log.printf("answer: %s%n", reply.message().getContent());
        return new Report(sessionId, List.copyOf(contexts), List.copyOf(progress),
            reply.message().getContent(), calibration);
      }

      // 6. Run the tools; the answer and its results go in with the next prepare.
      List<Message> next = new ArrayList<>();
      next.add(reply.message());
      for (ToolCall call : reply.message().getToolCallsList()) {
        next.add(Messages.toolResult(call.getId(), FakeModel.listFiles(call)));
      }
      pending = next;
    }
  }

  /** A canned model: {@code rounds} list_files calls, then a final answer. */
  public static final class FakeModel {
    /** The model's answer and its usage. */
    public record Reply(Message message, long outputTokens, String finishReason) {}

    private final int rounds;
    private int calls;

    public FakeModel(int rounds) {
      this.rounds = rounds;
    }

    public Reply complete(List<Message> view) {
      if (view.isEmpty() || view.get(view.size() - 1).getRole() == Role.ROLE_ASSISTANT) {
        throw new IllegalStateException("the view must end with a user turn or tool results");
      }
      if (calls < rounds) {
        calls++;
        String id = "call_" + calls;
        Message m = Messages.assistant("Let me look at module " + calls + ".",
            Messages.toolCall(id, "list_files", "{\"path\":\"src/module_" + calls + "\"}"));
        return new Reply(m, 24, "tool_calls");
      }
      boolean summarized = view.stream().anyMatch(Message::getSummary);
      return new Reply(Messages.assistant("The retry policy is configured in src/module_3/http/RetryPolicy.java"
          + (summarized ? " (found after ctxfold folded the early exploration)." : ".")), 20, "stop");
    }

    /** About 1500 characters of fake `ls -l` output, different for every call. */
    public static String listFiles(ToolCall call) {
      String path = call.getArguments().replaceAll(".*\"path\":\"([^\"]*)\".*", "$1");
      StringBuilder out = new StringBuilder();
      int seed = Math.abs(call.getId().hashCode());
      for (int i = 0; out.length() < 1500; i++) {
        int size = (seed * 31 + i * 7919) % 90_000 + 100;
        out.append(String.format("-rw-r--r-- 1 dev dev %6d Nov %2d 10:%02d %s/%s_%d.%s%n",
            size, i % 28 + 1, (seed + i) % 60, path,
            new String[] {"Handler", "Client", "Config", "Retry", "Backoff", "Test"}[(seed + i) % 6],
            i, i % 3 == 0 ? "java" : i % 3 == 1 ? "kt" : "md"));
      }
      return out.toString();
    }
  }

  /** {@code AgentLoop [TARGET [ROUNDS]]}; the bearer token comes from CTXFOLD_TOKEN if set. */
  public static void main(String[] args) {
    String target = args.length > 0 ? args[0] : "127.0.0.1:50051";
    int rounds = args.length > 1 ? Integer.parseInt(args[1]) : 8;
    try (CtxfoldClient client = CtxfoldClient.builder()
        .target(target)
        .bearerToken(System.getenv("CTXFOLD_TOKEN"))
        .defaultDeadline(Duration.ofSeconds(60))
        .build()) {
      Report report = run(client, rounds, System.out);
      System.out.printf("%d prepares, folded: %s, calibration %.3f%n", report.contexts().size(),
          report.folded(), report.lastCalibration().factor());
    }
  }
}
