// Package weir is the root of the weir module: a gateway that pools LLM
// accounts for coding agents. The code lives in cmd/weir, controlplane,
// dataplane, jobs and internal; this file only holds the generators.
//
// `go generate .` regenerates gen/ (buf), controlplane/db (sqlc) and
// docs/configuration.md, the configuration reference (from the Config
// structs' comments).
package weir

//go:generate go tool -modfile=internal/tools/go.mod buf lint
//go:generate go tool -modfile=internal/tools/go.mod buf generate
//go:generate go tool -modfile=internal/tools/go.mod sqlc generate -f sql/sqlc.yaml
//go:generate go test ./cmd/weir -run TestConfigurationReference -count=1 -update
