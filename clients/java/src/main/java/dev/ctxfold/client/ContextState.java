package dev.ctxfold.client;

import com.google.gson.FieldNamingPolicy;
import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonParseException;
import java.util.List;
import java.util.Map;

/**
 * A session's context state document (schema version 3), as {@code getContextState} returns it:
 * the server's bookkeeping, for diagnostics. Fields a newer server adds are left out.
 *
 * @param schemaVersion the document's schema version
 * @param fingerprint identifies the branch and the covered prefix the projection belongs to
 * @param generation the view generation (a fold or rewind starts a new one)
 * @param transcriptVersion the head seq the state was made at
 * @param checkpointId the head checkpoint (null when nothing was folded)
 * @param coveredCount the seq the head checkpoint covers
 * @param summaryHash the hash of the head summary
 * @param pruned the id of each pruned message, with the tokens of its pruned stub
 * @param projectionVersion the version of the projection
 * @param sourceTokens the estimate of the view as loaded, before maintenance
 * @param projectionTokens the estimate of the view as answered
 * @param promptCacheKey the prompt-cache key
 * @param cacheState warm, cold or unknown
 * @param lastActivity the time of the last prepare, in seconds since the Unix epoch
 * @param calibration the estimator's calibration factor
 * @param views the last views answered
 * @param failedFoldTokens the estimate a fold failed at (not retried until the view grows)
 * @param receipts the last maintenance steps
 * @param lastReceipt the last of them (null when none)
 * @param telemetry counters
 */
public record ContextState(
    int schemaVersion,
    String fingerprint,
    long generation,
    long transcriptVersion,
    String checkpointId,
    long coveredCount,
    String summaryHash,
    Map<String, Long> pruned,
    long projectionVersion,
    long sourceTokens,
    long projectionTokens,
    String promptCacheKey,
    String cacheState,
    double lastActivity,
    double calibration,
    List<ViewRecord> views,
    long failedFoldTokens,
    List<Receipt> receipts,
    Receipt lastReceipt,
    Map<String, Long> telemetry) {

  /**
   * A view the server answered.
   *
   * @param version its version
   * @param estimatedTokens its uncalibrated input estimate
   */
  public record ViewRecord(long version, long estimatedTokens) {}

  /**
   * One maintenance step.
   *
   * @param operationId the step's id
   * @param status applied, noop, blocked or failed
   * @param action prune, summary or noop
   * @param tokensIn the estimate before it
   * @param tokensOut the estimate after it
   * @param reason why
   * @param time when, in seconds since the Unix epoch
   * @param tokensSaved the tokens it saved (on the last receipt)
   */
  public record Receipt(
      String operationId, String status, String action, long tokensIn, long tokensOut, String reason, double time,
      long tokensSaved) {}

  private static final Gson JSON = new GsonBuilder()
      .setFieldNamingPolicy(FieldNamingPolicy.LOWER_CASE_WITH_UNDERSCORES)
      .create();

  static ContextState parse(String json) {
    try {
      ContextState state = JSON.fromJson(json, ContextState.class);
      if (state == null) {
        throw Engine.protocolViolation("the context state is empty");
      }
      return state;
    } catch (JsonParseException e) {
      throw Engine.protocolViolation("the context state is not the documented JSON object: " + e.getMessage());
    }
  }
}
