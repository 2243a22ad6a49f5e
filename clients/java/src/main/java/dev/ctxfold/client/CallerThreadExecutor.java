package dev.ctxfold.client;

import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.Executor;
import java.util.concurrent.LinkedBlockingQueue;

/**
 * The executor of the blocking client's calls: gRPC queues the call's callbacks here and the
 * calling thread runs them while it waits, so the blocking and async clients share one
 * implementation and a blocking call's progress listener runs on the caller's thread (as
 * grpc-java's own blocking stubs do). Tasks arriving after the wait ended run where they arrive.
 */
final class CallerThreadExecutor implements Executor {
  private static final Runnable WAKE = () -> { };

  private final LinkedBlockingQueue<Runnable> tasks = new LinkedBlockingQueue<>();
  private volatile boolean waiting = true;

  @Override
  public void execute(Runnable task) {
    if (waiting) {
      tasks.add(task);
      if (!waiting && tasks.remove(task)) {
        task.run();
      }
    } else {
      task.run();
    }
  }

  /** Runs the queued callbacks until one arrives; false when interrupted. */
  boolean runOne() {
    try {
      tasks.take().run();
      return true;
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return false;
    }
  }

  /** Runs callbacks on this thread until {@code future} completes, then returns its value or throws. */
  <T> T await(CompletableFuture<T> future) {
    future.whenComplete((value, error) -> tasks.add(WAKE));
    try {
      while (!future.isDone()) {
        if (!runOne()) {
          future.cancel(true);
          break;
        }
      }
      return future.join();
    } catch (CompletionException e) {
      // A listener's own exception is rethrown as it is; call failures are CtxfoldExceptions.
      if (e.getCause() instanceof RuntimeException) {
        throw (RuntimeException) e.getCause();
      }
      if (e.getCause() instanceof Error) {
        throw (Error) e.getCause();
      }
      throw CtxfoldException.from(e);
    } catch (CancellationException e) {
      throw CtxfoldException.from(e);
    } finally {
      finish();
    }
  }

  /** Ends the wait: runs what is queued and lets later callbacks run where they arrive. */
  void finish() {
    waiting = false;
    for (Runnable task; (task = tasks.poll()) != null; ) {
      task.run();
    }
  }
}
