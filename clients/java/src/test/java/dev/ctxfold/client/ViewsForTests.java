package dev.ctxfold.client;

import dev.ctxfold.v1.PreparedContext;
import java.util.List;

/** Views built in tests, as the client builds them from a whole PreparedContext. */
public final class ViewsForTests {
  private ViewsForTests() {}

  public static View of(long stablePrefixMessages, String promptCacheKey, Message... messages) {
    PreparedContext proto = PreparedContext.newBuilder()
        .addAllMessages(Message.toProto(List.of(messages)))
        .setViewMessageCount(messages.length)
        .setStablePrefixMessages(stablePrefixMessages)
        .setPromptCacheKey(promptCacheKey)
        .build();
    return new View(proto, List.of(messages), List.of());
  }
}
