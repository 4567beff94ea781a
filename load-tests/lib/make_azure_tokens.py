#!/usr/bin/env python3
"""Makes azure_conv_tokens.json: (prompt, output) token pairs sampled from the Azure LLM inference trace 2023.

Source: testdata/azure_llm_2023/AzureLLMInferenceTrace_conv.csv, a copy of
github.com/Azure/AzurePublicDataset data/AzureLLMInferenceTrace_conv.csv (commit 790921015d50dd6aae7f7e47f39ba0e235ad6b08),
CC-BY 4.0, Microsoft Azure; cite Patel et al., "Splitwise", ISCA 2024.

Every k-th request in time order is kept (a systematic sample, so the token distribution is preserved and the
file is the same on every run). Usage: python3 load-tests/lib/make_azure_tokens.py [N]
"""
import csv
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
src = os.path.join(here, "..", "..", "testdata", "azure_llm_2023", "AzureLLMInferenceTrace_conv.csv")
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
with open(src, newline="") as f:
    rows = [(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv.DictReader(f)]
step = max(1, len(rows) // n)
pairs = rows[::step][:n]
out = {
    "source": "Azure LLM inference trace 2023 (conversation), AzurePublicDataset commit "
              "790921015d50dd6aae7f7e47f39ba0e235ad6b08, CC-BY 4.0, Microsoft Azure (Splitwise, ISCA 2024)",
    "sampling": f"every {step}th of {len(rows)} requests in time order",
    "pairs": [[p, o] for p, o in pairs],
}
with open(os.path.join(here, "azure_conv_tokens.json"), "w") as f:
    json.dump(out, f, separators=(",", ":"))
    f.write("\n")
prompts = sorted(p for p, _ in pairs)
outs = sorted(o for _, o in pairs)
print(f"{len(pairs)} pairs; prompt median {prompts[len(prompts)//2]}, output median {outs[len(outs)//2]}")
