"""A second, independent client of Tessera's KEDA external scaler, generated from the same .proto with Python's
grpcio-tools (PyPI), as a Python-side implementer of KEDA's interface would. The Rust test `keda.rs` runs it and
compares its answers with its own.

Usage: keda_client.py ADDRESS NAMESPACE MODEL [--ca CA --cert CERT --key KEY]
Prints one JSON object: the metric spec, the metric value and IsActive, or the gRPC error of each call.
"""

import argparse
import json
import pathlib
import sys
import tempfile

import grpc
from grpc_tools import protoc


def generate(proto: pathlib.Path, out: pathlib.Path) -> None:
    code = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{proto.parent}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            str(proto),
        ]
    )
    if code != 0:
        sys.exit(f"protoc failed on {proto} with {code}")


def call(fn):
    try:
        return {"ok": fn()}
    except grpc.RpcError as e:
        return {"code": e.code().name, "message": e.details()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("address")
    p.add_argument("namespace")
    p.add_argument("model")
    p.add_argument("--ca")
    p.add_argument("--cert")
    p.add_argument("--key")
    a = p.parse_args()

    proto = pathlib.Path(__file__).resolve().parents[2] / "keda" / "proto" / "externalscaler.proto"
    out = pathlib.Path(tempfile.mkdtemp(prefix="keda-py-"))
    generate(proto, out)
    sys.path.insert(0, str(out))
    import externalscaler_pb2 as pb  # noqa: E402  (generated above)
    import externalscaler_pb2_grpc as rpc  # noqa: E402

    if a.ca:
        read = lambda f: pathlib.Path(f).read_bytes() if f else None  # noqa: E731
        creds = grpc.ssl_channel_credentials(read(a.ca), read(a.key), read(a.cert))
        channel = grpc.secure_channel(a.address, creds, options=[("grpc.ssl_target_name_override", "localhost")])
    else:
        channel = grpc.insecure_channel(a.address)
    stub = rpc.ExternalScalerStub(channel)
    ref = pb.ScaledObjectRef(name="chat-so", namespace=a.namespace, scalerMetadata={"model": a.model})

    def spec():
        s = stub.GetMetricSpec(ref, timeout=5).metricSpecs[0]
        return {"metricName": s.metricName, "targetSize": s.targetSize, "targetSizeFloat": s.targetSizeFloat}

    def metrics():
        req = pb.GetMetricsRequest(scaledObjectRef=ref, metricName="s0-tessera-desired-replicas")
        v = stub.GetMetrics(req, timeout=5).metricValues[0]
        return {"metricName": v.metricName, "metricValue": v.metricValue, "metricValueFloat": v.metricValueFloat}

    def active():
        return stub.IsActive(ref, timeout=5).result

    print(json.dumps({"spec": call(spec), "metrics": call(metrics), "active": call(active)}))


if __name__ == "__main__":
    main()
