/**
 * Provider adapters: a {@link dev.ctxfold.client.View} as the request of OpenAI Chat Completions
 * ({@link dev.ctxfold.client.adapters.OpenAiChat}), OpenAI Responses
 * ({@link dev.ctxfold.client.adapters.OpenAiResponses}) or Anthropic Messages
 * ({@link dev.ctxfold.client.adapters.AnthropicMessages}), and the provider's response back as the
 * messages to append plus the usage to observe ({@link dev.ctxfold.client.adapters.ProviderTurn}).
 *
 * <p>Requests and responses are plain JSON-shaped values ({@code Map<String, Object>}, lists,
 * strings, numbers, booleans) so no provider SDK is needed: add {@code model}, {@code tools} and
 * the rest of the request, serialize it with any JSON library, and hand the parsed response (or its
 * JSON text) back.
 */
package dev.ctxfold.client.adapters;
