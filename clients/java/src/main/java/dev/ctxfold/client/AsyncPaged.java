package dev.ctxfold.client;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.function.Consumer;
import java.util.function.Function;

/**
 * The items of a paged list RPC for the async client: pages are requested one after the other, the
 * next when the previous one has been handed over. Each call starts again from the first page.
 *
 * <pre>{@code
 * client.async().listSessions().forEach(s -> System.out.println(s.getId())).join();
 * }</pre>
 */
public final class AsyncPaged<T> {
  private final Function<String, CompletableFuture<Paged.Page<T>>> fetch;

  AsyncPaged(Function<String, CompletableFuture<Paged.Page<T>>> fetch) {
    this.fetch = fetch;
  }

  /** Hands every item to {@code action} in order; completes after the last page. */
  public CompletableFuture<Void> forEach(Consumer<? super T> action) {
    return Engine.cancellable(() -> from("", new HashSet<>(), action));
  }

  private CompletableFuture<Void> from(String token, Set<String> seen, Consumer<? super T> action) {
    return fetch.apply(token).thenCompose(page -> {
      page.items().forEach(action);
      String next = Paged.checkToken(seen, page.nextPageToken());
      return next.isEmpty() ? CompletableFuture.completedFuture(null) : from(next, seen, action);
    });
  }

  /** Fetches every page and completes with all items. */
  public CompletableFuture<List<T>> toList() {
    List<T> all = new ArrayList<>();
    return forEach(all::add).thenApply(v -> all);
  }
}
