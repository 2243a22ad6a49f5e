package dev.ctxfold.client;


/**
 * One item of {@code prepareEvents} / {@code compactEvents}: zero or more {@link Progress} events,
 * then exactly one {@link Result}.
 */
public sealed interface FoldEvent permits FoldEvent.Progress, FoldEvent.Result {
  /** A maintenance progress event (its {@code stage()} prints as {@code FOLD_STAGE_…}). */
  record Progress(FoldProgress progress) implements FoldEvent {}

  /** The whole view; always the last event. */
  record Result(View view) implements FoldEvent {}
}
