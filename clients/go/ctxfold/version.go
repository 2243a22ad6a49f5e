package ctxfold

// Version is this SDK's version, equal to the project version in the repository's VERSION file
// (a test fails when they differ). The user agent is "ctxfold-go/" + Version.
const Version = "0.2.0"

// userAgent names the SDK to the server (gRPC appends its own "grpc-go/…").
const userAgent = "ctxfold-go/" + Version
