"""A PyTorch TCPStore server for chorus's tests, driven over stdin.

Prints the port it listens on, then obeys one command per line and answers
each with one line:

    set KEY HEX        -> ok
    get KEY            -> HEX of the value (waits for the key, 30 s)
    add KEY N          -> the new value
    check KEY...       -> 1 if every key exists, else 0
    num_keys           -> the number of keys
    quit               -> (exits)

Values travel as hex so that any bytes survive the line protocol.
"""
import datetime
import sys

from torch.distributed import TCPStore

store = TCPStore(
    "127.0.0.1",
    0,
    is_master=True,
    wait_for_workers=False,
    timeout=datetime.timedelta(seconds=30),
)
print(store.port, flush=True)

for line in sys.stdin:
    cmd, *args = line.split()
    if cmd == "set":
        store.set(args[0], bytes.fromhex(args[1]) if len(args) > 1 else b"")
        out = "ok"
    elif cmd == "get":
        out = store.get(args[0]).hex()
    elif cmd == "add":
        out = str(store.add(args[0], int(args[1])))
    elif cmd == "check":
        out = "1" if store.check(args) else "0"
    elif cmd == "num_keys":
        out = str(store.num_keys())
    elif cmd == "quit":
        break
    else:
        out = f"error: unknown command {cmd}"
    print(out, flush=True)
