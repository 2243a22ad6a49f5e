import type { View } from "./model.js";

/**
 * The last whole view of each session, least recently used evicted beyond `capacity` (default
 * 256 sessions): what prepare() names as `known_view_version` and applies a delta to.
 */
export class ViewCache {
  private readonly entries = new Map<string, View>();

  constructor(readonly capacity: number) {}

  /** The session's last view, now the most recently used. */
  get(sessionId: string): View | undefined {
    const view = this.entries.get(sessionId);
    if (view !== undefined) {
      this.entries.delete(sessionId);
      this.entries.set(sessionId, view);
    }
    return view;
  }

  set(sessionId: string, view: View): void {
    if (this.capacity <= 0) {
      return;
    }
    this.entries.delete(sessionId);
    this.entries.set(sessionId, view);
    for (const oldest of this.entries.keys()) {
      if (this.entries.size <= this.capacity) {
        break;
      }
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
 * The whole view of a delta answer: the cached base view (of version `knownVersion`) followed by
 * the delta's messages. Undefined when the delta does not fit the base (no base, another version,
 * or a count that does not add up) — the caller then asks for the whole view.
 */
export function applyDelta<M>(
  delta: { messages: readonly M[]; viewMessageCount: number },
  base: { viewVersion: number; messages: readonly M[] } | undefined,
  knownVersion: number,
): M[] | undefined {
  if (base === undefined || knownVersion === 0 || base.viewVersion !== knownVersion) {
    return undefined;
  }
  const messages = [...base.messages, ...delta.messages];
  return messages.length === delta.viewMessageCount ? messages : undefined;
}
