package dev.ctxfold.client;

import java.time.Instant;

/**
 * A session as the server described it when a call returned it (a snapshot).
 *
 * @param id the session id
 * @param config the effective configuration, defaults filled in
 * @param headSeq the seq of the newest live message (0 for an empty session)
 * @param checkpointId the head checkpoint ("" when nothing was folded)
 * @param createTime when the session was created (null when unset)
 * @param updateTime when the session last changed (null when unset)
 * @param forkedFromSessionId the session this one was forked from ("" when none)
 * @param forkedAtSeq the seq the fork was taken at
 */
public record Session(
    String id,
    SessionSettings config,
    long headSeq,
    String checkpointId,
    Instant createTime,
    Instant updateTime,
    String forkedFromSessionId,
    long forkedAtSeq) {

  /** The session as the generated type. */
  public dev.ctxfold.v1.Session toProto() {
    dev.ctxfold.v1.Session.Builder out = dev.ctxfold.v1.Session.newBuilder()
        .setId(id).setConfig(config.toProto()).setHeadSeq(headSeq).setCheckpointId(checkpointId)
        .setForkedFromSessionId(forkedFromSessionId).setForkedAtSeq(forkedAtSeq);
    if (createTime != null) {
      out.setCreateTime(Times.toProto(createTime));
    }
    if (updateTime != null) {
      out.setUpdateTime(Times.toProto(updateTime));
    }
    return out.build();
  }

  /** A generated session. */
  public static Session fromProto(dev.ctxfold.v1.Session s) {
    return new Session(s.getId(), SessionSettings.fromProto(s.getConfig()), s.getHeadSeq(), s.getCheckpointId(),
        s.hasCreateTime() ? Times.of(s.getCreateTime()) : null, s.hasUpdateTime() ? Times.of(s.getUpdateTime()) : null,
        s.getForkedFromSessionId(), s.getForkedAtSeq());
  }
}
