package dev.ctxfold.client;

/**
 * The answer to {@code observeUsage}: the session's estimate calibration factor after this
 * observation (reported / estimated) and whether this observation changed it.
 *
 * @param calibration the calibration factor
 * @param calibrationAccepted whether this observation changed it (out-of-bounds ones are ignored)
 */
public record UsageResult(double calibration, boolean calibrationAccepted) {}
