"""A trainer that breaks off a weights broadcast: `python broadcast_sender.py URL ADMIN_TOKEN FOLDER`.

Announces FOLDER's model.safetensors to URL as version "broken", joins the group the replica opened, sends
the first half of the tensors, prints one JSON line {"transfer": ...} and sleeps (the test kills it, or lets
the replica's --p2p-timeout run out first).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request

from safetensors.torch import load_file

from eagle3_target.client.broadcast import announcement, join_group
from eagle3_target.protocol import contract


def main() -> None:
    url, token, folder = sys.argv[1:4]
    tensors = load_file(f"{folder}/model.safetensors")
    request = urllib.request.Request(
        f"{url}/{contract.BROADCAST}",
        data=announcement(tensors, "broken").encode(),
        headers={"Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        reply = json.loads(resp.read())
    group = join_group(reply, 30)
    half = dict(list(tensors.items())[: len(tensors) // 2])
    group.send(half, None, 30)
    print(json.dumps({"transfer": reply["transfer"]}), flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main()
