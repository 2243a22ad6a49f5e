package dev.ctxfold.client;

import dev.ctxfold.v1.ErrorReason;
import java.util.Objects;
import java.util.function.Consumer;

/**
 * Options of one {@code compact} call.
 *
 * <pre>{@code
 * View view = client.compact(sessionId, CompactOptions.builder()
 *     .focus("keep the failing test names")
 *     .keepTokens(2_000)
 *     .onProgress(p -> System.out.println(p.stage()))
 *     .build());
 * }</pre>
 */
public final class CompactOptions {
  private static final CompactOptions DEFAULTS = builder().build();

  private final String focus;
  private final long keepTokens;
  private final boolean dryRun;
  private final Consumer<FoldProgress> onProgress;

  private CompactOptions(Builder b) {
    this.focus = b.focus;
    this.keepTokens = b.keepTokens;
    this.dryRun = b.dryRun;
    this.onProgress = b.onProgress;
  }

  public static Builder builder() {
    return new Builder();
  }

  /** No focus, the minimal kept set, a real fold, progress ignored. */
  public static CompactOptions defaults() {
    return DEFAULTS;
  }

  public String focus() {
    return focus;
  }

  public long keepTokens() {
    return keepTokens;
  }

  public boolean dryRun() {
    return dryRun;
  }

  public Consumer<FoldProgress> onProgress() {
    return onProgress;
  }

  /** A builder holding these options. */
  public Builder toBuilder() {
    return builder().focus(focus).keepTokens(keepTokens).dryRun(dryRun).onProgress(onProgress);
  }

  public static final class Builder {
    private String focus = "";
    private long keepTokens;
    private boolean dryRun;
    private Consumer<FoldProgress> onProgress = PrepareOptions.IGNORE;

    private Builder() {}

    /** Extra instructions appended to the summary instructions (what to keep in focus). */
    public Builder focus(String focus) {
      this.focus = Objects.requireNonNull(focus, "focus");
      return this;
    }

    /** Tokens of the newest history to keep verbatim; 0 = the minimal kept set. */
    public Builder keepTokens(long tokens) {
      if (tokens < 0) {
        throw CtxfoldException.invalidArgument(ErrorReason.INVALID_REQUEST, "keep_tokens",
            "keep_tokens must be >= 0, got " + tokens);
      }
      this.keepTokens = tokens;
      return this;
    }

    /** Make the candidate view and summary ({@link View#candidateSummary()}) without installing it. */
    public Builder dryRun(boolean dryRun) {
      this.dryRun = dryRun;
      return this;
    }

    /** Called for every fold progress event, in order, before the call returns. */
    public Builder onProgress(Consumer<FoldProgress> listener) {
      this.onProgress = Objects.requireNonNull(listener, "listener");
      return this;
    }

    public CompactOptions build() {
      return new CompactOptions(this);
    }
  }
}
