package dev.ctxfold.client;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.Set;
import java.util.Spliterator;
import java.util.Spliterators;
import java.util.function.Function;
import java.util.stream.Stream;
import java.util.stream.StreamSupport;

/**
 * The items of a paged list RPC, fetched lazily page by page ({@code page_token} →
 * {@code next_page_token}) as the iteration goes on. Each {@link #iterator()} starts again from
 * the first page.
 *
 * <pre>{@code
 * for (Session s : client.listSessions()) { ... }
 * List<Message> all = client.listMessages(id).stream().toList();
 * }</pre>
 */
public final class Paged<T> implements Iterable<T> {
  /** One page: its items and the token of the next page ("" on the last page). */
  public record Page<T>(List<T> items, String nextPageToken) {}

  private final Function<String, Page<T>> fetch;

  Paged(Function<String, Page<T>> fetch) {
    this.fetch = fetch;
  }

  /** The next page token, refused when the server hands out one it gave before (a loop). */
  static String checkToken(Set<String> seen, String token) {
    if (!token.isEmpty() && !seen.add(token)) {
      throw Engine.protocolViolation("the server repeated the page token " + token);
    }
    return token;
  }

  @Override
  public Iterator<T> iterator() {
    return new Iterator<>() {
      private final Set<String> seen = new HashSet<>();
      private Iterator<T> current = List.<T>of().iterator();
      private String token = "";
      private boolean last;

      @Override
      public boolean hasNext() {
        while (!current.hasNext()) {
          if (last) {
            return false;
          }
          Page<T> page = fetch.apply(token);
          current = page.items().iterator();
          token = checkToken(seen, page.nextPageToken());
          last = token.isEmpty();
        }
        return true;
      }

      @Override
      public T next() {
        if (!hasNext()) {
          throw new NoSuchElementException();
        }
        return current.next();
      }
    };
  }

  /** The pages themselves, fetched lazily. */
  public Iterable<Page<T>> pages() {
    return () -> new Iterator<>() {
      private final Set<String> seen = new HashSet<>();
      private String token = "";
      private boolean done;

      @Override
      public boolean hasNext() {
        return !done;
      }

      @Override
      public Page<T> next() {
        if (done) {
          throw new NoSuchElementException();
        }
        Page<T> page = fetch.apply(token);
        token = checkToken(seen, page.nextPageToken());
        done = token.isEmpty();
        return page;
      }
    };
  }

  /** A sequential stream over all items. */
  public Stream<T> stream() {
    return StreamSupport.stream(Spliterators.spliteratorUnknownSize(iterator(), Spliterator.ORDERED), false);
  }

  /** Fetches every page and returns all items. */
  public List<T> toList() {
    List<T> all = new ArrayList<>();
    forEach(all::add);
    return all;
  }
}
