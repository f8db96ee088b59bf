"""Generates the message code from ../../proto with grpcio-tools' protoc at build time."""
import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
GEN = HERE / "threadwire_client" / "gen"


def generate():
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {PROTO_ROOT}")
    GEN.mkdir(exist_ok=True)
    if protoc.main(["protoc", f"-I{PROTO_ROOT}", f"--python_out={GEN}", *protos]) != 0:
        raise SystemExit("protoc failed")
    for folder in (GEN, GEN / "threadwire", GEN / "threadwire" / "v1"):
        (folder / "__init__.py").touch()


class BuildWithProtos(build_py):
    def run(self):
        generate()
        super().run()


# Also before setup(): setuptools checks the package folders exist while it
# gathers metadata, before build_py runs.
generate()
setup(cmdclass={"build_py": BuildWithProtos})
