package dev.ctxfold.client;

/**
 * The answer to {@link CtxfoldClient#observeUsage}: the session's estimate calibration factor
 * (reported / estimated) and whether this observation changed it.
 */
public record Calibration(double factor, boolean accepted) {}
