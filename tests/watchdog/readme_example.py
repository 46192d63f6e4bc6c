"""The documentation's watchdog example (docs/examples.md includes it); a test runs it."""

import asyncio

import anyio
from fastapi import FastAPI, WebSocket, WebSocketDisconnect

from asgi_admission import AdmissionMiddleware, SessionHalt, SessionWatchdog, session_watchdog

connections: dict[str, WebSocket] = {}


async def tell_user(halt: SessionHalt) -> None:
    """Called once per halt, after the process group got SIGTERM."""
    websocket = connections.get(halt.session_id)
    if websocket is not None:
        await websocket.send_json({"halted": halt.reason, "message": halt.message})


watchdog = SessionWatchdog.from_env(on_halt=tell_user)  # ADMISSION_* settings
app = FastAPI()
app.add_middleware(AdmissionMiddleware, session_routes=["WS /terminal/*"], watchdog=watchdog)


@app.websocket("/terminal/{name}")
async def terminal(websocket: WebSocket, name: str) -> None:
    await websocket.accept()
    shell = await asyncio.create_subprocess_exec(
        "cat",  # stands in for a PTY shell, an agent CLI or a kernel
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        start_new_session=True,  # its own process group, so a halt takes all of it
    )
    assert shell.stdin is not None  # both piped above
    assert shell.stdout is not None
    budget = int(websocket.query_params.get("budget_mb", "512")) * 1024 * 1024
    connections[name] = websocket
    # Leaving the block unregisters the session; its peak RSS goes into the histogram.
    with session_watchdog(websocket).register(shell.pid, budget_bytes=budget, session_id=name):
        try:
            while True:
                shell.stdin.write((await websocket.receive_text() + "\n").encode())
                await websocket.send_text((await shell.stdout.readline()).decode())
        except WebSocketDisconnect:
            pass
        finally:
            connections.pop(name, None)
            # Shielded: a handler cancelled by its server (a shutdown, a test client)
            # still reaps its shell, so no process outlives the event loop unreaped.
            with anyio.CancelScope(shield=True):
                if shell.returncode is None:
                    shell.kill()
                await shell.wait()
