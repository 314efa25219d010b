package controlplane

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestLeafPackagesImportNothingOfOurs: package seal and package upstream
// know nothing of the database (controlplane/db) or of any other package
// of weir: the control plane hands them what they need and converts what
// they return.
func TestLeafPackagesImportNothingOfOurs(t *testing.T) {
	t.Parallel()
	const module = "github.com/weirhq/weir"
	for _, dir := range []string{"seal", "upstream"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no Go files (%v)", dir, err)
		}
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				if path == module || strings.HasPrefix(path, module+"/") {
					t.Errorf("%s imports %s", name, path)
				}
			}
		}
	}
}
