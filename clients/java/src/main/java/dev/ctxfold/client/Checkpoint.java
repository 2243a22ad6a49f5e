package dev.ctxfold.client;

import java.time.Instant;
import java.util.List;

/**
 * A committed fold with its summary.
 *
 * @param id the checkpoint id
 * @param parentId the checkpoint this one folded ("" for the first fold of a chain)
 * @param positionSeq the seq of the last message the checkpoint covers
 * @param summary the summary message text the view shows
 * @param summaryTokens tokens of the summary
 * @param keptMessageIds the covered messages the view keeps verbatim
 * @param foldedResultsRef the checkpoint's folded-results index, readable with readToolResult
 * @param summarizer the summarizer that wrote the summary
 * @param createTime when the checkpoint was installed (null when unset)
 * @param onHeadChain the session's head checkpoint is this one or descends from it
 */
public record Checkpoint(
    String id,
    String parentId,
    long positionSeq,
    String summary,
    long summaryTokens,
    List<String> keptMessageIds,
    String foldedResultsRef,
    String summarizer,
    Instant createTime,
    boolean onHeadChain) {

  public Checkpoint {
    keptMessageIds = List.copyOf(keptMessageIds);
  }

  /** The checkpoint as the generated type. */
  public dev.ctxfold.v1.Checkpoint toProto() {
    dev.ctxfold.v1.Checkpoint.Builder out = dev.ctxfold.v1.Checkpoint.newBuilder()
        .setId(id).setParentId(parentId).setPositionSeq(positionSeq).setSummary(summary)
        .setSummaryTokens(summaryTokens).addAllKeptMessageIds(keptMessageIds).setFoldedResultsRef(foldedResultsRef)
        .setSummarizer(summarizer).setOnHeadChain(onHeadChain);
    if (createTime != null) {
      out.setCreateTime(Times.toProto(createTime));
    }
    return out.build();
  }

  /** A generated checkpoint. */
  public static Checkpoint fromProto(dev.ctxfold.v1.Checkpoint c) {
    return new Checkpoint(c.getId(), c.getParentId(), c.getPositionSeq(), c.getSummary(), c.getSummaryTokens(),
        c.getKeptMessageIdsList(), c.getFoldedResultsRef(), c.getSummarizer(),
        c.hasCreateTime() ? Times.of(c.getCreateTime()) : null, c.getOnHeadChain());
  }
}
