package dev.ctxfold.client;

import dev.ctxfold.v1.Role;
import java.time.Instant;
import java.util.List;
import java.util.Objects;

/**
 * A message of the transcript or of a view. {@code role}, {@code content}, {@code toolCalls},
 * {@code toolCallId}, {@code reasoningContent}, {@code pinned} and {@code name} are the caller's
 * (build them with {@link Messages}); the server sets the rest.
 *
 * @param id the canonical message's id; in a view, the id of the message it renders ("" for the
 *     summary and the configured system prompt)
 * @param seq the position in the session's transcript, from 1
 * @param role the author
 * @param content the text (a large tool result: its bounded head and tail with a marker naming
 *     {@code resultRef})
 * @param toolCalls the tool calls of an assistant message
 * @param toolCallId for a tool result, the call it answers
 * @param reasoningContent the model's reasoning text, where the provider returns it
 * @param pinned kept verbatim by every fold
 * @param resultRef the reference {@code readToolResult} reads this message's whole stored text by,
 *     where the server set one
 * @param rawBytes for tool results, the size of the raw result in UTF-8 bytes
 * @param truncated {@code content} is bounded and shorter than the raw result
 * @param summary in a view, the checkpoint summary message
 * @param pruned in a view, shown as head, marker and tail
 * @param name an optional participant or tool name, passed through to the provider
 * @param tokens the estimate of the message as rendered
 * @param abandoned on a branch a rewind left
 * @param createTime when the message was appended (null when unset)
 */
public record Message(
    String id,
    long seq,
    Role role,
    String content,
    List<ToolCall> toolCalls,
    String toolCallId,
    String reasoningContent,
    boolean pinned,
    String resultRef,
    long rawBytes,
    boolean truncated,
    boolean summary,
    boolean pruned,
    String name,
    long tokens,
    boolean abandoned,
    Instant createTime) {

  public Message {
    Objects.requireNonNull(role, "role");
    id = id == null ? "" : id;
    content = content == null ? "" : content;
    toolCalls = List.copyOf(toolCalls == null ? List.of() : toolCalls);
    toolCallId = toolCallId == null ? "" : toolCallId;
    reasoningContent = reasoningContent == null ? "" : reasoningContent;
    resultRef = resultRef == null ? "" : resultRef;
    name = name == null ? "" : name;
  }

  /** A message to append: the caller's fields, the server's unset. */
  static Message of(Role role, String content, List<ToolCall> toolCalls, String toolCallId) {
    return new Message("", 0, role, content, toolCalls, toolCallId, "", false, "", 0, false, false, false, "", 0, false,
        null);
  }

  /** The same message, pinned (folds keep it verbatim) or not. */
  public Message withPinned(boolean pinned) {
    return new Message(id, seq, role, content, toolCalls, toolCallId, reasoningContent, pinned, resultRef, rawBytes,
        truncated, summary, pruned, name, tokens, abandoned, createTime);
  }

  /** The same message with this participant or tool name. */
  public Message withName(String name) {
    return new Message(id, seq, role, content, toolCalls, toolCallId, reasoningContent, pinned, resultRef, rawBytes,
        truncated, summary, pruned, name, tokens, abandoned, createTime);
  }

  /** The same message with this reasoning text. */
  public Message withReasoningContent(String reasoningContent) {
    return new Message(id, seq, role, content, toolCalls, toolCallId, reasoningContent, pinned, resultRef, rawBytes,
        truncated, summary, pruned, name, tokens, abandoned, createTime);
  }

  /** The message as the generated type. */
  public dev.ctxfold.v1.Message toProto() {
    dev.ctxfold.v1.Message.Builder out = dev.ctxfold.v1.Message.newBuilder()
        .setId(id).setSeq(seq).setRole(role).setContent(content).setToolCallId(toolCallId)
        .setReasoningContent(reasoningContent).setPinned(pinned).setResultRef(resultRef).setRawBytes(rawBytes)
        .setTruncated(truncated).setSummary(summary).setPruned(pruned).setName(name).setTokens(tokens)
        .setAbandoned(abandoned);
    toolCalls.forEach(call -> out.addToolCalls(call.toProto()));
    if (createTime != null) {
      out.setCreateTime(Times.toProto(createTime));
    }
    return out.build();
  }

  /** A generated message. */
  public static Message fromProto(dev.ctxfold.v1.Message m) {
    return new Message(m.getId(), m.getSeq(), m.getRole(), m.getContent(),
        m.getToolCallsList().stream().map(ToolCall::fromProto).toList(), m.getToolCallId(), m.getReasoningContent(),
        m.getPinned(), m.getResultRef(), m.getRawBytes(), m.getTruncated(), m.getSummary(), m.getPruned(),
        m.getName(), m.getTokens(), m.getAbandoned(), m.hasCreateTime() ? Times.of(m.getCreateTime()) : null);
  }

  static List<Message> fromProto(List<dev.ctxfold.v1.Message> messages) {
    return messages.stream().map(Message::fromProto).toList();
  }

  static List<dev.ctxfold.v1.Message> toProto(List<Message> messages) {
    return messages.stream().map(Message::toProto).toList();
  }
}
