// Module tools pins the code generators (buf, protoc-gen-go,
// protoc-gen-connect-go, sqlc) apart from weir's own dependencies.
// Run them with `go tool -modfile=internal/tools/go.mod NAME`.
package tools
