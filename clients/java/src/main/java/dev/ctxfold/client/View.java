package dev.ctxfold.client;

import dev.ctxfold.v1.Action;
import dev.ctxfold.v1.CacheState;
import dev.ctxfold.v1.NotFoldedReason;
import dev.ctxfold.v1.PreparedContext;
import java.util.List;
import java.util.Optional;

/**
 * The provider-visible context to send to the model, as returned by {@code prepare},
 * {@code compact} and {@code retry}.
 *
 * <p>{@link #messages()} is always the <em>whole</em> view: when the server answered with a delta
 * (only the messages after the view this client already held), the client has put the two
 * together. {@link #received()} is what travelled on the wire; {@link #toProto()} is the generated
 * {@link PreparedContext} as received.
 */
public final class View {
  private final PreparedContext proto;
  private final List<Message> messages;
  private final List<FoldProgress> progress;

  View(PreparedContext proto, List<Message> messages, List<FoldProgress> progress) {
    this.proto = proto;
    this.messages = List.copyOf(messages);
    this.progress = List.copyOf(progress);
  }

  /** The whole view: system, at most one summary, kept messages and the recent tail. */
  public List<Message> messages() {
    return messages;
  }

  /** The messages the server sent: the whole view, or only the new tail when {@link #delta()}. */
  public List<Message> received() {
    return Message.fromProto(proto.getMessagesList());
  }

  /** True when the server sent a delta that the client applied to the view it held. */
  public boolean delta() {
    return proto.getDelta();
  }

  /** The version of this view: pass it (or the view) to {@code observeUsage}. */
  public long viewVersion() {
    return proto.getViewVersion();
  }

  /**
   * Estimated request tokens (messages, overheads, tools, max_output_tokens; calibrated): what the
   * trigger and the hard limit compare.
   */
  public long estimatedTokens() {
    return proto.getEstimatedTokens();
  }

  /**
   * Estimated input tokens: {@link #estimatedTokens()} without the reserved max_output_tokens. Compare
   * it with the input tokens the provider reports, or report it when a provider reports none.
   */
  public long estimatedInputTokens() {
    return proto.getEstimatedInputTokens();
  }

  /** What maintenance this call performed: NONE, PRUNED or FOLDED. */
  public Action action() {
    return proto.getAction();
  }

  /** True when this call folded history into a summary checkpoint. */
  public boolean folded() {
    return proto.getAction() == Action.ACTION_FOLDED;
  }

  /** The provider prompt cache as judged before this request. */
  public CacheState cacheState() {
    return proto.getCacheState();
  }

  /** The prompt-cache key to send with the provider request. */
  public String promptCacheKey() {
    return proto.getPromptCacheKey();
  }

  /** The head checkpoint rendered in the view ("" when nothing was folded). */
  public String checkpointId() {
    return proto.getCheckpointId();
  }

  /** Number of leading messages identical to the previous view (the provider-cacheable prefix). */
  public long stablePrefixMessages() {
    return proto.getStablePrefixMessages();
  }

  /** Number of messages in the whole view. */
  public long viewMessageCount() {
    return proto.getViewMessageCount();
  }

  /** The trigger: compact_ratio × context_window. */
  public long triggerTokens() {
    return proto.getTriggerTokens();
  }

  /** The hard ceiling: context_window − max_output_tokens − 256. */
  public long hardLimitTokens() {
    return proto.getHardLimitTokens();
  }

  /** The messages this call appended, with ids and seqs. */
  public List<Message> appended() {
    return Message.fromProto(proto.getAppendedList());
  }

  /** Why the call folded nothing although it was asked to (UNSPECIFIED when it folded or did not try). */
  public NotFoldedReason notFoldedReason() {
    return proto.getNotFoldedReason();
  }

  /** A human-readable explanation of {@link #notFoldedReason()} ("" when none). */
  public String notFoldedDetail() {
    return proto.getNotFoldedDetail();
  }

  /** For a Compact dry run: the summary the fold would install ("" otherwise). */
  public String candidateSummary() {
    return proto.getCandidateSummary();
  }

  /** The reference of the head checkpoint's folded-results index, readable with readToolResult. */
  public String foldedResultsRef() {
    return proto.getFoldedResultsRef();
  }

  /** The summary message of the view, if history was folded. */
  public Optional<Message> summary() {
    return messages.stream().filter(Message::summary).findFirst();
  }

  /**
   * Whether the view shows something only in part that {@code read_tool_result} reads whole: a
   * bounded or pruned message, or a summary (whose folded-results index names the folded results).
   */
  public boolean hidesResults() {
    return !foldedResultsRef().isEmpty()
        || messages.stream().anyMatch(m -> m.truncated() || m.pruned() || m.summary());
  }

  /** Every progress event the call streamed, in order. */
  public List<FoldProgress> progress() {
    return progress;
  }

  /** The result message as received (with {@code delta}, its messages are only the new tail). */
  public PreparedContext toProto() {
    return proto;
  }

  @Override
  public String toString() {
    return "View{viewVersion=" + viewVersion()
        + ", messages=" + messages.size()
        + ", estimatedTokens=" + estimatedTokens()
        + ", estimatedInputTokens=" + estimatedInputTokens()
        + ", action=" + action()
        + ", delta=" + delta()
        + ", checkpointId=" + checkpointId() + "}";
  }
}
