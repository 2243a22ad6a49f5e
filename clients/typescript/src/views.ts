import type { Message, PreparedContext } from "./gen/ctxfold/v1/context_service_pb.js";

/** The last full view the client holds for one session. */
export interface CachedView {
  viewVersion: bigint;
  messages: readonly Message[];
}

/**
 * A bounded, least-recently-used map from session id to the last full view, used to ask
 * Prepare for deltas (`known_view_version`) and to rebuild the full view from them.
 */
export class ViewCache {
  private readonly entries = new Map<string, CachedView>();

  constructor(readonly capacity: number) {}

  get(sessionId: string): CachedView | undefined {
    const entry = this.entries.get(sessionId);
    if (entry) {
      this.entries.delete(sessionId);
      this.entries.set(sessionId, entry);
    }
    return entry;
  }

  set(sessionId: string, view: CachedView): void {
    if (this.capacity <= 0) {
      return;
    }
    this.entries.delete(sessionId);
    this.entries.set(sessionId, view);
    while (this.entries.size > this.capacity) {
      const oldest = this.entries.keys().next().value as string;
      this.entries.delete(oldest);
    }
  }

  delete(sessionId: string): void {
    this.entries.delete(sessionId);
  }

  clear(): void {
    this.entries.clear();
  }

  get size(): number {
    return this.entries.size;
  }
}

/**
 * The full view of a Prepare/Compact result. For a full result this is `result.messages`; for a
 * delta it is the cached base followed by the new tail. Returns undefined when the delta cannot
 * be applied (no base, wrong base version, or the message count does not add up).
 */
export function applyView(result: PreparedContext, base: CachedView | undefined, sentKnownVersion: bigint): Message[] | undefined {
  if (!result.delta) {
    return [...result.messages];
  }
  if (!base || sentKnownVersion === 0n || base.viewVersion !== sentKnownVersion) {
    return undefined;
  }
  const messages = [...base.messages, ...result.messages];
  // view_message_count is the whole view's size; 0 (not reported) skips the check.
  if (result.viewMessageCount !== 0n && BigInt(messages.length) !== result.viewMessageCount) {
    return undefined;
  }
  return messages;
}
