/**
 * W3C trace-context propagation. When the optional peer dependency `@opentelemetry/api` is
 * installed and a propagator is registered (e.g. by the OpenTelemetry Node SDK, or
 * `propagation.setGlobalPropagator(new W3CTraceContextPropagator())`), the active context is
 * injected into every call's metadata (`traceparent`, `tracestate`, baggage, …). Without it,
 * nothing is injected; an explicit `traceparent` option always wins.
 */
import { ErrorReason, invalidArgument } from "./errors.js";

/** The slice of @opentelemetry/api this module uses. */
interface OtelApi {
  context: { active(): unknown };
  propagation: {
    inject(context: unknown, carrier: Headers, setter: { set(carrier: Headers, key: string, value: string): void }): void;
  };
}

let otelLoad: Promise<OtelApi | null> | undefined;

/** Loads @opentelemetry/api once; null when it is not installed. */
export function loadOpenTelemetry(): Promise<OtelApi | null> {
  otelLoad ??= (async () => {
    try {
      const name = "@opentelemetry/api";
      const mod = (await import(name)) as { default?: OtelApi } & Partial<OtelApi>;
      const api = (mod.propagation ? mod : mod.default) as OtelApi | undefined;
      return api?.propagation && api.context ? api : null;
    } catch {
      return null;
    }
  })();
  return otelLoad;
}

const headerSetter = {
  set(carrier: Headers, key: string, value: string): void {
    carrier.set(key, value);
  },
};

/** An explicit W3C trace context for one call (or a provider of one for every call). */
export interface TraceContext {
  traceparent: string;
  tracestate?: string;
}

const TRACEPARENT = /^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/;

/** True for a syntactically valid W3C `traceparent` value. */
export function isValidTraceparent(value: string): boolean {
  return TRACEPARENT.test(value) && !/^[0-9a-f]{2}-0{32}-/.test(value) && !/-0{16}-[0-9a-f]{2}$/.test(value);
}

/**
 * Adds trace context to `headers`: the explicit one when given (validated), else the active
 * OpenTelemetry context when the API is present and `useOpenTelemetry` is true. An existing
 * `traceparent` header is left alone.
 */
export async function injectTraceContext(
  headers: Headers,
  explicit: TraceContext | undefined,
  useOpenTelemetry: boolean,
): Promise<void> {
  if (headers.has("traceparent")) {
    return;
  }
  if (explicit) {
    if (!isValidTraceparent(explicit.traceparent)) {
      throw invalidArgument(ErrorReason.INVALID_CLIENT_ARGUMENT, "traceparent", `invalid traceparent ${JSON.stringify(explicit.traceparent)}`);
    }
    headers.set("traceparent", explicit.traceparent);
    if (explicit.tracestate) {
      headers.set("tracestate", explicit.tracestate);
    }
    return;
  }
  if (!useOpenTelemetry) {
    return;
  }
  const api = await loadOpenTelemetry();
  if (api) {
    api.propagation.inject(api.context.active(), headers, headerSetter);
  }
}
