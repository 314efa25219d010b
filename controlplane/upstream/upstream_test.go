package upstream

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// epoch is where every test clock starts: whole seconds.
var epoch = time.Date(2030, time.March, 4, 5, 6, 7, 0, time.UTC)

func f64(v float64) *float64 { return &v }

func tm(t time.Time) *time.Time { return &t }

// requireReadings compares readings by window, utilization (to 1e-9) and
// reset instant.
func requireReadings(t *testing.T, got, want []Reading) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d readings %s, want %d %s", len(got), readingsText(got), len(want), readingsText(want))
	}
	for i := range got {
		if g, w := readingText(got[i]), readingText(want[i]); g != w {
			t.Errorf("reading %d: got %s, want %s", i, g, w)
		}
	}
}

func readingText(r Reading) string {
	u, at := "nil", "nil"
	if r.Utilization != nil {
		u = fmt.Sprintf("%.9f", *r.Utilization)
	}
	if r.ResetsAt != nil {
		at = r.ResetsAt.UTC().Format(time.RFC3339Nano)
	}
	return r.Window + " " + u + " " + at
}

func readingsText(rs []Reading) string {
	s := "["
	for i, r := range rs {
		if i > 0 {
			s += ", "
		}
		s += readingText(r)
	}
	return s + "]"
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{"450": 450 * time.Second, "": 0, "soon": 0, "-3": 0, "999999": 30 * time.Minute} {
		if got := retryAfter(in); got != want {
			t.Errorf("retryAfter(%q) = %v, want %v", in, got, want)
		}
	}
}

// The usage endpoints' paths are used by their readers alone, so that the
// control plane's test of its read budget (every read through fetchUsage)
// covers every read.
func TestUsagePathsOnlyInTheirReaders(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	readers := map[string]string{"AnthropicUsagePath": "ReadAnthropicUsage", "CodexUsagePath": "ReadCodexUsage"}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok {
				continue
			}
			ast.Inspect(fn, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.Ident:
					if reader, ok := readers[n.Name]; ok && fn.Name.Name != reader {
						t.Errorf("%s: %s uses %s", fset.Position(n.Pos()), fn.Name.Name, n.Name)
					}
				case *ast.BasicLit:
					if n.Kind == token.STRING && (strings.Contains(n.Value, "oauth/usage") || strings.Contains(n.Value, "wham/usage")) {
						t.Errorf("%s: %s names a usage endpoint", fset.Position(n.Pos()), fn.Name.Name)
					}
				}
				return true
			})
		}
	}
}
