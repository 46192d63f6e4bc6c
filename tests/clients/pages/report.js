// Posts what a page saw to its own server, which the test reads back.
export async function report(seen) {
  const run = new URLSearchParams(location.search).get("run");
  await fetch(`/results/${run}`, { method: "POST", body: JSON.stringify(seen) });
}

export const query = new URLSearchParams(location.search);
