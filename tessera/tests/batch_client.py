"""The official OpenAI Python client against Tessera's Batch API (tessera/tests/batch.rs runs it).

Usage: batch_client.py BASE_URL MODEL complete|cancel LINES

complete: upload LINES chat lines (one of them invalid for the model server, so the error file has a line),
          create a batch, poll it to `completed`, download the output and error files, check every custom_id is
          answered exactly once, list files and batches, delete the input file.
cancel:   the same upload, create, cancel at once, poll to `cancelled`, check every custom_id once across both
          files (unsent lines as `batch_cancelled`).
Prints one JSON object with what it saw; exits non-zero on any failed check.
"""
import io
import json
import sys
import time

from openai import OpenAI


def main():
    base, model, mode, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=30)
    lines = []
    for i in range(n):
        body = {"model": model, "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 4}
        if i == 1:
            body["max_tokens"] = -1  # the model server refuses it: this line must land in the error file
        lines.append(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}))
    data = ("\n".join(lines) + "\n").encode()
    f = client.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch")
    assert f.bytes == len(data), (f.bytes, len(data))
    assert f.purpose == "batch"
    batch = client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"job": mode}
    )
    assert batch.status == "validating", batch.status
    if mode == "cancel":
        batch = client.batches.cancel(batch.id)
        assert batch.status in ("cancelling", "cancelled"), batch.status
    final = {"complete": "completed", "cancel": "cancelled"}[mode]
    seen_statuses = [batch.status]
    deadline = time.time() + 50
    while batch.status != final:
        assert time.time() < deadline, f"batch still {batch.status}"
        assert batch.status not in ("failed", "expired"), batch
        time.sleep(0.1)
        batch = client.batches.retrieve(batch.id)
        if batch.status != seen_statuses[-1]:
            seen_statuses.append(batch.status)
    counts = batch.request_counts
    assert counts.total == n, counts
    assert counts.completed + counts.failed == n, counts

    answered = {}
    for fid, kind in ((batch.output_file_id, "output"), (batch.error_file_id, "error")):
        if fid is None:
            continue
        meta = client.files.retrieve(fid)
        assert meta.purpose == "batch_output", meta
        text = client.files.content(fid).text
        for line in text.splitlines():
            rec = json.loads(line)
            cid = rec["custom_id"]
            assert cid not in answered, f"{cid} answered twice"
            answered[cid] = (kind, rec)
    assert sorted(answered) == sorted(f"req-{i}" for i in range(n)), "every custom_id exactly once"
    outputs = sum(1 for k, _ in answered.values() if k == "output")
    errors = n - outputs
    assert outputs == counts.completed and errors == counts.failed, (outputs, errors, counts)
    if mode == "complete":
        assert answered["req-1"][0] == "error" and answered["req-1"][1]["response"]["status_code"] == 400
        assert answered["req-0"][1]["response"]["body"]["choices"], answered["req-0"]
        assert batch.usage.total_tokens > 0, batch.usage
    else:
        cancelled = sum(1 for k, r in answered.values() if k == "error" and (r.get("error") or {}).get("code") == "batch_cancelled")
        assert cancelled > 0, "a cancel at once leaves lines unsent"
        assert batch.cancelled_at is not None

    listed_batches = [b.id for b in client.batches.list(limit=100)]
    assert batch.id in listed_batches
    listed_files = [x.id for x in client.files.list()]
    assert f.id in listed_files
    deleted = client.files.delete(f.id)
    assert deleted.deleted
    assert f.id not in [x.id for x in client.files.list()]
    print(json.dumps({"batch": batch.id, "statuses": seen_statuses, "completed": counts.completed,
                      "failed": counts.failed, "total": counts.total, "usage": batch.usage.total_tokens}))


if __name__ == "__main__":
    main()
