package dev.ctxfold.client;

import dev.ctxfold.v1.FoldStage;

/**
 * One maintenance progress event of a prepare or compact call.
 *
 * @param stage what happened (prints as {@code FOLD_STAGE_…})
 * @param passIndex the 1-based fold pass (0 outside passes)
 * @param passesPlanned the passes planned for this fold
 * @param tokensBefore the request estimate before the step
 * @param tokensAfter the request estimate after the step
 * @param checkpointId the checkpoint a committed pass installed
 * @param message a description of the step for a person
 * @param summaryDelta for {@code FOLD_STAGE_SUMMARY_DELTA}, the next piece of the summary text
 * @param summarizer the summarizer of the step (for a fallback: the fallback)
 */
public record FoldProgress(
    FoldStage stage,
    int passIndex,
    int passesPlanned,
    long tokensBefore,
    long tokensAfter,
    String checkpointId,
    String message,
    String summaryDelta,
    String summarizer) {

  /** The event as the generated type. */
  public dev.ctxfold.v1.FoldProgress toProto() {
    return dev.ctxfold.v1.FoldProgress.newBuilder()
        .setStage(stage).setPassIndex(passIndex).setPassesPlanned(passesPlanned).setTokensBefore(tokensBefore)
        .setTokensAfter(tokensAfter).setCheckpointId(checkpointId).setMessage(message).setSummaryDelta(summaryDelta)
        .setSummarizer(summarizer).build();
  }

  /** A generated event. */
  public static FoldProgress fromProto(dev.ctxfold.v1.FoldProgress p) {
    return new FoldProgress(p.getStage(), p.getPassIndex(), p.getPassesPlanned(), p.getTokensBefore(),
        p.getTokensAfter(), p.getCheckpointId(), p.getMessage(), p.getSummaryDelta(), p.getSummarizer());
  }
}
