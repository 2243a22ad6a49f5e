/** The generated protobuf-es code of ctxfold.v1 and the google.rpc error details, for power users. */
export * from "./gen/ctxfold/v1/context_service_pb.js";
export * from "./gen/google/rpc/error_details_pb.js";
export * from "./gen/google/rpc/status_pb.js";
