package dev.ctxfold.client;

import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.function.Consumer;

/**
 * Options of one {@link CtxfoldClient#prepare(String, PrepareOptions)} call.
 *
 * <pre>{@code
 * View view = client.prepare(sessionId, PrepareOptions.builder()
 *     .append(Messages.user("Fix the failing test"))
 *     .onProgress(p -> log.info("{} {}", p.stage(), p.message()))
 *     .build());
 * }</pre>
 */
public final class PrepareOptions {
  static final Consumer<FoldProgress> IGNORE = p -> { };
  private static final PrepareOptions DEFAULTS = builder().build();

  private final List<Message> append;
  private final boolean overflow;
  private final String requestId;
  private final Consumer<FoldProgress> onProgress;
  private final boolean useDelta;

  private PrepareOptions(Builder b) {
    this.append = List.copyOf(b.append);
    this.overflow = b.overflow;
    this.requestId = b.requestId;
    this.onProgress = b.onProgress;
    this.useDelta = b.useDelta;
  }

  public static Builder builder() {
    return new Builder();
  }

  /** No append, no overflow, deltas on, progress ignored. */
  public static PrepareOptions defaults() {
    return DEFAULTS;
  }

  /** Shorthand for {@code builder().append(messages).build()}. */
  public static PrepareOptions appending(Message... messages) {
    return builder().append(messages).build();
  }

  public List<Message> append() {
    return append;
  }

  public boolean overflow() {
    return overflow;
  }

  public String requestId() {
    return requestId;
  }

  public Consumer<FoldProgress> onProgress() {
    return onProgress;
  }

  public boolean useDelta() {
    return useDelta;
  }

  public Builder toBuilder() {
    Builder b = new Builder();
    b.append.addAll(append);
    b.overflow = overflow;
    b.requestId = requestId;
    b.onProgress = onProgress;
    b.useDelta = useDelta;
    return b;
  }

  public static final class Builder {
    private final List<Message> append = new ArrayList<>();
    private boolean overflow;
    private String requestId = "";
    private Consumer<FoldProgress> onProgress = IGNORE;
    private boolean useDelta = true;

    private Builder() {}

    /** Messages to append before preparing (the user turn, the answer and its tool results, ...). */
    public Builder append(Message... messages) {
      for (Message m : messages) {
        append.add(Objects.requireNonNull(m, "message"));
      }
      return this;
    }

    public Builder append(List<Message> messages) {
      for (Message m : messages) {
        append.add(Objects.requireNonNull(m, "message"));
      }
      return this;
    }

    /** The provider rejected the last view as too long: maintain even below the trigger. */
    public Builder overflow(boolean overflow) {
      this.overflow = overflow;
      return this;
    }

    /**
     * Idempotency key of the append: a retried call with the same key appends nothing new. When
     * none is given the client sends a random UUID, so a retried call is idempotent anyway.
     */
    public Builder requestId(String requestId) {
      this.requestId = Objects.requireNonNull(requestId, "requestId");
      return this;
    }

    /**
     * Called for every fold progress event, in order, before prepare returns: on the calling
     * thread for the blocking client, on a gRPC thread for the async one.
     */
    public Builder onProgress(Consumer<FoldProgress> listener) {
      this.onProgress = Objects.requireNonNull(listener, "listener");
      return this;
    }

    /**
     * Whether to send the view version this client holds so the server may answer with only the
     * new messages (default true). The returned {@link View#messages()} is the full
     * view either way.
     */
    public Builder useDelta(boolean useDelta) {
      this.useDelta = useDelta;
      return this;
    }

    public PrepareOptions build() {
      return new PrepareOptions(this);
    }
  }
}
