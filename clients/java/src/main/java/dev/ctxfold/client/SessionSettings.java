package dev.ctxfold.client;

import dev.ctxfold.v1.ErrorReason;
import dev.ctxfold.v1.SessionConfig;
import java.time.Duration;
import java.util.List;
import java.util.Objects;
import java.util.OptionalDouble;

/**
 * Typed, immutable settings of a session (the wire form is the generated
 * {@link SessionConfig}, see {@link #toProto()}). Unset fields are sent as zero, which the server reads as
 * "use the default" (compact ratio 0.80, tail ratio 0.08, summary 8192 tokens, tool content
 * 32768 bytes, the {@code extractive} summarizer, a derived prompt-cache key).
 *
 * <pre>{@code
 * SessionSettings settings = SessionSettings.builder()
 *     .contextWindow(128_000)
 *     .maxOutputTokens(4_096)
 *     .systemPrompt("You are a careful coding agent.")
 *     .model("gpt-4.1")
 *     .build();
 * }</pre>
 *
 * <p>{@link #overrides()} builds a partial config for {@code fork}: only the fields set replace the
 * source session's.
 */
public final class SessionSettings {
  private final SessionConfig proto;

  private SessionSettings(SessionConfig proto) {
    this.proto = proto;
  }

  /** A builder for a new session's config; {@link Builder#contextWindow} is required. */
  public static Builder builder() {
    return new Builder(true);
  }

  /** A builder for fork overrides: every field is optional, unset fields keep the source's value. */
  public static Builder overrides() {
    return new Builder(false);
  }

  /** Wraps a config read from the server (for example {@code session.getConfig()}). */
  public static SessionSettings fromProto(SessionConfig proto) {
    return new SessionSettings(Objects.requireNonNull(proto, "proto"));
  }

  /** The wire message. */
  public SessionConfig toProto() {
    return proto;
  }

  /** A builder holding this config's values. */
  public Builder toBuilder() {
    Builder b = new Builder(false);
    b.proto.mergeFrom(proto);
    return b;
  }

  public long contextWindow() {
    return proto.getContextWindow();
  }

  public double compactRatio() {
    return proto.getCompactRatio();
  }

  public double tailRatio() {
    return proto.getTailRatio();
  }

  public long maxOutputTokens() {
    return proto.getMaxOutputTokens();
  }

  public long summaryMaxTokens() {
    return proto.getSummaryMaxTokens();
  }

  public long toolContentMaxBytes() {
    return proto.getToolContentMaxBytes();
  }

  public String systemPrompt() {
    return proto.getSystemPrompt();
  }

  public String toolsJson() {
    return proto.getToolsJson();
  }

  public String summarizer() {
    return proto.getSummarizer();
  }

  public Duration cacheTtl() {
    return Duration.ofSeconds(proto.getCacheTtlSeconds());
  }

  public String promptCacheKey() {
    return proto.getPromptCacheKey();
  }

  public String model() {
    return proto.getModel();
  }

  public boolean disableTaskAnchor() {
    return proto.getDisableTaskAnchor();
  }

  /**
   * Where a fold starts in the background, as a share of the window; empty when unset (the server's
   * default: compact ratio − 0.05 for a summarizer that calls a model, off for {@code extractive}),
   * 0 when background folds are off.
   */
  public OptionalDouble prefoldRatio() {
    return proto.hasPrefoldRatio() ? OptionalDouble.of(proto.getPrefoldRatio()) : OptionalDouble.empty();
  }

  @Override
  public boolean equals(Object o) {
    return o instanceof SessionSettings && ((SessionSettings) o).proto.equals(proto);
  }

  @Override
  public int hashCode() {
    return proto.hashCode();
  }

  @Override
  public String toString() {
    return "SessionSettings{" + proto.toString().trim().replace('\n', ' ') + "}";
  }

  private static CtxfoldException invalid(String field, String why) {
    return CtxfoldException.invalidArgument(ErrorReason.INVALID_CONFIG, field, "config." + field + ": " + why);
  }

  /**
   * Builds a {@link SessionSettings}. A value outside its documented range is refused as the server
   * would refuse it: a {@link CtxfoldException} INVALID_CONFIG in the client domain, metadata
   * {@code field} naming it (as the proto does); checks that need the whole config stay the server's.
   */
  public static final class Builder {
    private final SessionConfig.Builder proto = SessionConfig.newBuilder();
    private final boolean requireWindow;

    private Builder(boolean requireWindow) {
      this.requireWindow = requireWindow;
    }

    /** The model's context window in tokens (required for a new session, &gt; 0). */
    public Builder contextWindow(long tokens) {
      if (tokens < 0) {
        throw invalid("context_window", "must be > 0, got " + tokens);
      }
      proto.setContextWindow(tokens);
      return this;
    }

    /** Maintenance runs when the request reaches ratio × window; [0.30, 0.95], default 0.80. */
    public Builder compactRatio(double ratio) {
      if (!(ratio >= 0.30 && ratio <= 0.95)) {
        throw invalid("compact_ratio", "must be within [0.30, 0.95], got " + ratio);
      }
      proto.setCompactRatio(ratio);
      return this;
    }

    /** Share of the window a fold keeps verbatim as the recent tail; (0, 0.5], default 0.08. */
    public Builder tailRatio(double ratio) {
      if (!(ratio > 0 && ratio <= 0.5)) {
        throw invalid("tail_ratio", "must be within (0, 0.5], got " + ratio);
      }
      proto.setTailRatio(ratio);
      return this;
    }

    /** Output tokens the agent asks the provider for; reserved in every estimate. */
    public Builder maxOutputTokens(long tokens) {
      if (tokens < 0) {
        throw invalid("max_output_tokens", "must be >= 0, got " + tokens);
      }
      proto.setMaxOutputTokens(tokens);
      return this;
    }

    /** Upper bound of one summary in tokens (default 8192). */
    public Builder summaryMaxTokens(long tokens) {
      if (tokens < 0) {
        throw invalid("summary_max_tokens", "must be >= 0, got " + tokens);
      }
      proto.setSummaryMaxTokens(tokens);
      return this;
    }

    /** Bound of a tool result's provider-visible content; [4096, 1048576], default 32768. */
    public Builder toolContentMaxBytes(long bytes) {
      if (bytes < 4096 || bytes > 1_048_576) {
        throw invalid("tool_content_max_bytes", "must be within [4096, 1048576], got " + bytes);
      }
      proto.setToolContentMaxBytes(bytes);
      return this;
    }

    /** The agent's system prompt: the first message of every view. */
    public Builder systemPrompt(String text) {
      proto.setSystemPrompt(Objects.requireNonNull(text, "systemPrompt"));
      return this;
    }

    /**
     * The provider tool schemas as JSON array text (a file, a recorded request); counted in every
     * estimate. Written in the one form every ctxfold SDK writes ({@link JsonText}), so the same
     * tools cost the same tokens whichever SDK created the session.
     */
    public Builder toolsJson(String json) {
      Objects.requireNonNull(json, "toolsJson");
      try {
        proto.setToolsJson(json.isEmpty() ? "" : JsonText.normalize(json));
      } catch (IllegalArgumentException e) {
        throw invalid("tools_json", e.getMessage());
      }
      return this;
    }

    /**
     * The provider tool schemas as JSON-shaped values (maps keep their iteration order: use
     * {@link java.util.LinkedHashMap}, or add {@link ModelTools#definitions}), written in the one form
     * every ctxfold SDK writes ({@link JsonText}).
     */
    public Builder tools(List<?> tools) {
      try {
        proto.setToolsJson(JsonText.write(Objects.requireNonNull(tools, "tools")));
      } catch (IllegalArgumentException e) {
        throw invalid("tools_json", e.getMessage());
      }
      return this;
    }

    /** Name of a summarizer configured on the server (default {@code extractive}). */
    public Builder summarizer(String name) {
      proto.setSummarizer(Objects.requireNonNull(name, "summarizer"));
      return this;
    }

    /** The provider's prompt-cache TTL (whole seconds). */
    public Builder cacheTtl(Duration ttl) {
      if (ttl.isNegative()) {
        throw invalid("cache_ttl_seconds", "must be >= 0, got " + ttl);
      }
      proto.setCacheTtlSeconds(ttl.getSeconds());
      return this;
    }

    /** The prompt-cache key to send with requests; unset = derived from the session id. */
    public Builder promptCacheKey(String key) {
      proto.setPromptCacheKey(Objects.requireNonNull(key, "promptCacheKey"));
      return this;
    }

    /** The model the agent calls (telemetry and cache TTL defaults). */
    public Builder model(String model) {
      proto.setModel(Objects.requireNonNull(model, "model"));
      return this;
    }

    /** Turns off the task anchor (the opening user message kept verbatim after the system prompt). */
    public Builder disableTaskAnchor(boolean disable) {
      proto.setDisableTaskAnchor(disable);
      return this;
    }

    /**
     * Where a fold starts in the background, as a share of the window: 0 turns background folds off;
     * otherwise within [0.10, compact ratio). Unset, the server's default applies.
     */
    public Builder prefoldRatio(double ratio) {
      if (ratio != 0 && !(ratio >= 0.10 && ratio < 1)) {
        throw invalid("prefold_ratio", "must be 0 (off) or within [0.10, compact_ratio), got " + ratio);
      }
      proto.setPrefoldRatio(ratio);
      return this;
    }

    public SessionSettings build() {
      if (requireWindow && proto.getContextWindow() <= 0) {
        throw invalid("context_window", "is required and must be > 0");
      }
      return new SessionSettings(proto.build());
    }
  }
}
