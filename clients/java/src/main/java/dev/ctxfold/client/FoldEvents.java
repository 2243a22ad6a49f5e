package dev.ctxfold.client;

import java.util.Iterator;
import java.util.Spliterator;
import java.util.Spliterators;
import java.util.stream.Stream;
import java.util.stream.StreamSupport;

/**
 * The events of one blocking {@code prepareEvents} / {@code compactEvents} call: zero or more
 * {@link FoldEvent.Progress}, then exactly one {@link FoldEvent.Result}. Iterate it directly
 * (each pull runs the call on the calling thread until the next event is there); a call iterated
 * to its end has released everything. To stop early, close it (try-with-resources), which cancels
 * the call.
 *
 * <pre>{@code
 * for (FoldEvent event : client.prepareEvents(sessionId, options)) {
 *   if (event instanceof FoldEvent.Result result) { send(result.view()); }
 * }
 * }</pre>
 */
public final class FoldEvents implements Iterable<FoldEvent>, AutoCloseable {
  private final Iterator<FoldEvent> events;
  private final Runnable cancel;
  private boolean iterated;

  FoldEvents(Iterator<FoldEvent> events, Runnable cancel) {
    this.events = events;
    this.cancel = cancel;
  }

  /** The events, once: a call streams its events one time. */
  @Override
  public Iterator<FoldEvent> iterator() {
    if (iterated) {
      throw new IllegalStateException("the events of one call can be iterated once");
    }
    iterated = true;
    return events;
  }

  /** The events as a sequential stream; closing the stream closes this. */
  public Stream<FoldEvent> stream() {
    return StreamSupport.stream(Spliterators.spliteratorUnknownSize(iterator(), Spliterator.ORDERED), false)
        .onClose(this::close);
  }

  /** Cancels the call if it is still running (a no-op once its result was pulled). */
  @Override
  public void close() {
    cancel.run();
  }
}
