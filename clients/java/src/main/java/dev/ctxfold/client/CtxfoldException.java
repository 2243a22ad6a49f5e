package dev.ctxfold.client;

import com.google.protobuf.Any;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.rpc.ErrorInfo;
import io.grpc.Status;
import io.grpc.StatusException;
import io.grpc.StatusRuntimeException;
import io.grpc.protobuf.StatusProto;
import java.util.Map;

/**
 * A failed ctxfold call: the gRPC status {@link #code()}, the server's human-readable
 * {@link #statusMessage()}, and the {@code google.rpc.ErrorInfo} detail the server attaches to every
 * error: {@link #reason()} (an UPPER_SNAKE code such as {@code SESSION_NOT_FOUND}, see
 * {@link Reasons}), {@link #domain()} ({@code ctxfold.dev}) and {@link #metadata()}.
 *
 * <p>Unchecked, like {@link StatusRuntimeException}, which is kept as the {@link #getCause()}.
 */
public class CtxfoldException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  private final Status.Code code;
  private final String statusMessage;
  private final String reason;
  private final String domain;
  private final Map<String, String> metadata;

  public CtxfoldException(
      Status.Code code,
      String statusMessage,
      String reason,
      String domain,
      Map<String, String> metadata,
      Throwable cause) {
    super(describe(code, statusMessage, reason), cause);
    this.code = code;
    this.statusMessage = statusMessage == null ? "" : statusMessage;
    this.reason = reason == null ? "" : reason;
    this.domain = domain == null ? "" : domain;
    this.metadata = metadata == null ? Map.of() : Map.copyOf(metadata);
  }

  /**
   * Converts any throwable from a gRPC call. {@link StatusRuntimeException} and
   * {@link StatusException} are read with {@link StatusProto#fromThrowable} for the ErrorInfo;
   * a CtxfoldException is returned as it is; anything else becomes code UNKNOWN.
   */
  public static CtxfoldException from(Throwable t) {
    if (t instanceof CtxfoldException) {
      return (CtxfoldException) t;
    }
    Status status = Status.fromThrowable(t);
    String reason = "";
    String domain = "";
    Map<String, String> metadata = Map.of();
    com.google.rpc.Status details = StatusProto.fromThrowable(t);
    if (details != null) {
      for (Any any : details.getDetailsList()) {
        if (any.is(ErrorInfo.class)) {
          try {
            ErrorInfo info = any.unpack(ErrorInfo.class);
            reason = info.getReason();
            domain = info.getDomain();
            metadata = info.getMetadataMap();
          } catch (InvalidProtocolBufferException e) {
            // A malformed detail: keep the status alone.
          }
          break;
        }
      }
    }
    String message = status.getDescription() != null ? status.getDescription() : "";
    if (details != null && message.isEmpty()) {
      message = details.getMessage();
    }
    return new CtxfoldException(status.getCode(), message, reason, domain, metadata, t);
  }

  private static String describe(Status.Code code, String message, String reason) {
    StringBuilder out = new StringBuilder().append(code);
    if (reason != null && !reason.isEmpty()) {
      out.append(" [").append(reason).append(']');
    }
    if (message != null && !message.isEmpty()) {
      out.append(": ").append(message);
    }
    return out.toString();
  }

  /** The gRPC status code, e.g. {@code NOT_FOUND}. */
  public Status.Code code() {
    return code;
  }

  /** The status description the server wrote for a person ("" when none). */
  public String statusMessage() {
    return statusMessage;
  }

  /** The ErrorInfo reason, e.g. {@code SESSION_NOT_FOUND}; "" when the error carried no ErrorInfo. */
  public String reason() {
    return reason;
  }

  /** The ErrorInfo domain: {@code ctxfold.dev} for errors of the service, "" when absent. */
  public String domain() {
    return domain;
  }

  /** The ErrorInfo metadata (for example {@code session_id}); immutable, possibly empty. */
  public Map<String, String> metadata() {
    return metadata;
  }

  /** True when {@link #reason()} equals {@code reason}. */
  public boolean is(String reason) {
    return this.reason.equals(reason);
  }
}
