"""Generated protobuf and gRPC code for protos/pdmesh/v1 (scripts/gen_protos.sh)."""
