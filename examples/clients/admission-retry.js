// Retrying a session that asgi-admission refused, in a browser (an ES module).
//
// A refused WebSocket is closed with code 1013 (Try Again Later) and a reason like
//   "retry_after_s=5; reason=session_limit; Session limit reached"
// and a refused fetch gets status 503 with a Retry-After header and an
// application/problem+json body carrying retry_after_s, reason and title.
// Cross-origin, Retry-After is readable only if the server's CORSMiddleware wraps
// the guard and exposes it (docs/clients.md); the body is the fallback.

/** What a refusal says: seconds to wait, the machine reason and a sentence for people. */
export class Refusal {
  constructor(retryAfterS, reason, message) {
    this.retryAfterS = retryAfterS;
    this.reason = reason;
    this.message = message;
  }
}

/** The refusal a WebSocket close event carries, or null for any other close. */
export function refusalOfClose(event) {
  if (event.code !== 1013) return null;
  const [delay, reason, ...words] = event.reason.split("; ");
  const seconds = /^retry_after_s=(\d+)$/.exec(delay ?? "");
  if (seconds === null) return null;
  const why = /^reason=([a-z_]+)$/.exec(reason ?? "");
  return new Refusal(Number(seconds[1]), why ? why[1] : "", words.join("; "));
}

/** The refusal a fetch response carries, or null when it is not the guard's 503. */
export async function refusalOfResponse(response) {
  if (response.status !== 503) return null;
  let problem = {};
  try {
    problem = await response.clone().json();
  } catch {
    // Not the guard's problem+json (a proxy's 503, say): Retry-After alone decides.
  }
  const header = Number.parseInt(response.headers.get("Retry-After") ?? "", 10);
  const retryAfterS = Number.isInteger(header) ? header : problem.retry_after_s;
  if (!Number.isInteger(retryAfterS)) return null;
  return new Refusal(retryAfterS, problem.reason ?? "", problem.title ?? "Service busy");
}

const sleep = (seconds) => new Promise((resolve) => setTimeout(resolve, seconds * 1000));

/**
 * fetch(), waiting out up to maxAttempts - 1 refusals; onWait(refusal, attempt) is
 * told of each wait (show refusal.message and the countdown to the user).
 * Resolves with the last response: the admitted one, or the last refusal.
 * The body must be re-sendable (a string, not a stream).
 */
export async function fetchWithRetry(input, init = {}, { maxAttempts = 5, onWait } = {}) {
  for (let attempt = 1; ; attempt++) {
    const response = await fetch(input, init);
    const refusal = attempt < maxAttempts ? await refusalOfResponse(response) : null;
    if (refusal === null) return response;
    onWait?.(refusal, attempt);
    await sleep(refusal.retryAfterS);
  }
}

/**
 * Opens a WebSocket and reopens it after each 1013 refusal, up to maxAttempts in all.
 * onOpen(socket) may see a socket the guard then refuses: its close follows at
 * once, and onWait(refusal, attempt) is told before the next attempt. onClose(event,
 * refusal) is told of the last close (refusal is null unless it was one).
 */
export function connectWithRetry(url, { protocols, maxAttempts = 5, onOpen, onWait, onClose } = {}) {
  let attempt = 0;
  const connect = () => {
    attempt += 1;
    const socket = new WebSocket(url, protocols);
    socket.addEventListener("open", () => onOpen?.(socket));
    socket.addEventListener("close", (event) => {
      const refusal = refusalOfClose(event);
      if (refusal !== null && attempt < maxAttempts) {
        onWait?.(refusal, attempt);
        setTimeout(connect, refusal.retryAfterS * 1000);
      } else {
        onClose?.(event, refusal);
      }
    });
  };
  connect();
}

/** One line for the user: why the session is waiting, and for how long. */
export function describe(refusal) {
  const why = refusal.message || "The service is busy";
  return `${why}; trying again in ${refusal.retryAfterS} s.`;
}
