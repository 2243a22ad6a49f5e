package dev.ctxfold.client;

import com.google.protobuf.Any;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.rpc.ErrorInfo;
import com.google.rpc.RetryInfo;
import dev.ctxfold.v1.ErrorReason;
import io.grpc.Status;
import io.grpc.protobuf.StatusProto;
import java.time.Duration;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutionException;

/**
 * A failed ctxfold call: the gRPC status {@link #code()}, the server's {@link #statusMessage()},
 * and the {@code google.rpc.ErrorInfo} the server attaches to every error: {@link #reason()} (the
 * name of an {@link ErrorReason} value, compared with {@link #is(ErrorReason)}), {@link #domain()}
 * and {@link #metadata()}; {@link #retryDelay()} from {@code google.rpc.RetryInfo} when sent.
 * Failures the SDK detects itself carry the domain {@link #CLIENT_DOMAIN} and the reasons of
 * clients/README.md, which the enum also names: {@link ErrorReason#STREAM_ENDED_WITHOUT_RESULT},
 * {@link ErrorReason#RESULT_CHECKSUM_MISMATCH}, {@link ErrorReason#PROTOCOL_VIOLATION},
 * {@link ErrorReason#INVALID_CLIENT_ARGUMENT}; its argument checks carry the server's reason for
 * the same mistake ({@link ErrorReason#INVALID_CONFIG}, {@link ErrorReason#INVALID_PAGE_SIZE}, …).
 *
 * <pre>{@code
 * try {
 *   client.getSession(id);
 * } catch (CtxfoldException e) {
 *   if (e.is(ErrorReason.SESSION_NOT_FOUND)) { ... }
 * }
 * }</pre>
 *
 * <p>Unchecked, like {@link io.grpc.StatusRuntimeException}, which is kept as the {@link #getCause()}.
 */
public class CtxfoldException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** The {@link #domain()} of the server's errors: its ErrorInfo domain, as sent. */
  public static final String SERVER_DOMAIN = "ctxfold.dev";

  /** The {@link #domain()} of the errors this SDK raises itself (no server sent them). */
  public static final String CLIENT_DOMAIN = "client.ctxfold.dev";

  private final Status.Code code;
  private final String statusMessage;
  private final String reason;
  private final String domain;
  private final Map<String, String> metadata;
  private final Duration retryDelay;

  /**
   * An error with these parts.
   *
   * @param code the gRPC status code
   * @param statusMessage the description for a person
   * @param reason the ErrorInfo reason ("" when none)
   * @param domain the ErrorInfo domain ("" when none)
   * @param metadata the ErrorInfo metadata
   * @param retryDelay the RetryInfo delay, or null
   * @param cause the underlying throwable, or null
   */
  public CtxfoldException(
      Status.Code code,
      String statusMessage,
      String reason,
      String domain,
      Map<String, String> metadata,
      Duration retryDelay,
      Throwable cause) {
    super(describe(code, statusMessage, reason), cause);
    this.code = code;
    this.statusMessage = statusMessage == null ? "" : statusMessage;
    this.reason = reason == null ? "" : reason;
    this.domain = domain == null ? "" : domain;
    this.metadata = metadata == null ? Map.of() : Map.copyOf(metadata);
    this.retryDelay = retryDelay;
  }

  /** An error the SDK detected itself, in {@link #CLIENT_DOMAIN}. */
  static CtxfoldException client(Status.Code code, ErrorReason reason, String message) {
    return new CtxfoldException(code, message, reason.name(), CLIENT_DOMAIN, Map.of(), null, null);
  }

  /**
   * An argument the SDK refuses before any call: INVALID_ARGUMENT with the server's reason for the
   * same mistake (or INVALID_CLIENT_ARGUMENT), metadata {@code field} naming the argument.
   */
  static CtxfoldException invalidArgument(ErrorReason reason, String field, String message) {
    return new CtxfoldException(Status.Code.INVALID_ARGUMENT, message, reason.name(), CLIENT_DOMAIN,
        Map.of("field", field), null, null);
  }

  /**
   * Converts any throwable from a gRPC call: a status exception is read with
   * {@link StatusProto#fromThrowable} for its ErrorInfo and RetryInfo; a CtxfoldException (also
   * wrapped in a {@link CompletionException} or {@link ExecutionException}) is returned as it is;
   * a cancelled future becomes code CANCELLED; anything else becomes code UNKNOWN.
   */
  public static CtxfoldException from(Throwable t) {
    while ((t instanceof CompletionException || t instanceof ExecutionException) && t.getCause() != null) {
      t = t.getCause();
    }
    if (t instanceof CtxfoldException) {
      return (CtxfoldException) t;
    }
    if (t instanceof CancellationException) {
      return new CtxfoldException(Status.Code.CANCELLED, "the call was cancelled", "", "", Map.of(), null, t);
    }
    Status status = Status.fromThrowable(t);
    String reason = "";
    String domain = "";
    Map<String, String> metadata = Map.of();
    Duration retryDelay = null;
    com.google.rpc.Status details = StatusProto.fromThrowable(t);
    if (details != null) {
      for (Any any : details.getDetailsList()) {
        try {
          if (any.is(ErrorInfo.class)) {
            ErrorInfo info = any.unpack(ErrorInfo.class);
            reason = info.getReason();
            domain = info.getDomain();
            metadata = info.getMetadataMap();
          } else if (any.is(RetryInfo.class)) {
            com.google.protobuf.Duration d = any.unpack(RetryInfo.class).getRetryDelay();
            retryDelay = Duration.ofSeconds(d.getSeconds(), d.getNanos());
          }
        } catch (InvalidProtocolBufferException e) {
          // A malformed detail: keep the status and the other details.
        }
      }
    }
    String message = status.getDescription() != null ? status.getDescription() : "";
    if (details != null && message.isEmpty()) {
      message = details.getMessage();
    }
    return new CtxfoldException(status.getCode(), message, reason, domain, metadata, retryDelay, t);
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

  /** The reason as sent, e.g. {@code SESSION_NOT_FOUND}; "" when the error carried no ErrorInfo. */
  public String reason() {
    return reason;
  }

  /**
   * The reason as the generated enum: {@link ErrorReason#ERROR_REASON_UNSPECIFIED} when there is
   * none, {@link ErrorReason#UNRECOGNIZED} for a name this SDK's enum does not know.
   */
  public ErrorReason errorReason() {
    if (reason.isEmpty()) {
      return ErrorReason.ERROR_REASON_UNSPECIFIED;
    }
    try {
      return ErrorReason.valueOf(reason);
    } catch (IllegalArgumentException unknown) {
      return ErrorReason.UNRECOGNIZED;
    }
  }

  /**
   * Who raised the error: {@link #SERVER_DOMAIN} ({@code ctxfold.dev}, the server's ErrorInfo as
   * sent), {@link #CLIENT_DOMAIN} ({@code client.ctxfold.dev}, the SDK itself), or "" when the error
   * carried no ErrorInfo (transport failures, cancellation).
   */
  public String domain() {
    return domain;
  }

  /** The ErrorInfo metadata (for example {@code session_id}); immutable, possibly empty. */
  public Map<String, String> metadata() {
    return metadata;
  }

  /** How long the server asks to wait before retrying (google.rpc.RetryInfo), when it said. */
  public Optional<Duration> retryDelay() {
    return Optional.ofNullable(retryDelay);
  }

  /** True when the reason (the server's, or the SDK's own) is {@code reason}. */
  public boolean is(ErrorReason reason) {
    return reason != ErrorReason.UNRECOGNIZED && this.reason.equals(reason.name());
  }
}
