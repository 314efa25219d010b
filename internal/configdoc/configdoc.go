// Package configdoc builds the configuration reference in the README from
// the sources that define the configuration: the doc comments of the
// Config structs ("Env: WEIR_…" names a field's variable) and the table of
// process-level variables in cmd/weir. A test in cmd/weir compares the
// README with it, so the reference cannot drift from the code.
package configdoc

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"regexp"
	"sort"
	"strings"
)

// Var is one environment variable of the reference.
type Var struct {
	Name string
	// UsedBy lists the processes and commands that read it.
	UsedBy string
	// Meaning is what it sets, with its default.
	Meaning string
}

var envTag = regexp.MustCompile(`Env: ((?:WEIR|OTEL)_[A-Z0-9_]+)(?: \(([^)]*)\))?\.?`)

// FromStructs reads the fields of every struct named Config in files whose
// doc comment names an environment variable ("Env: WEIR_X."): the variable
// and the comment, less that sentence, as its meaning.
func FromStructs(files ...string) ([]Var, error) {
	var out []Var
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, parser.ParseComments)
		if err != nil {
			return nil, fmt.Errorf("configdoc: %w", err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || ts.Name.Name != "Config" {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return false
			}
			for _, field := range st.Fields.List {
				if field.Doc == nil {
					continue
				}
				doc := strings.Join(strings.Fields(field.Doc.Text()), " ")
				for _, m := range envTag.FindAllStringSubmatch(doc, -1) {
					meaning := strings.TrimSpace(strings.Replace(doc, m[0], "", 1))
					out = append(out, Var{Name: m[1], Meaning: strings.TrimSuffix(withoutSubject(meaning, field.Names), ".")})
				}
			}
			return false
		})
	}
	return out, nil
}

// withoutSubject drops the Go field name a doc comment starts with ("X
// is the …" reads "the …" in a table of variables).
func withoutSubject(doc string, names []*ast.Ident) string {
	for _, n := range names {
		if rest, ok := strings.CutPrefix(doc, n.Name+" "); ok {
			for _, verb := range []string{"is ", "are "} {
				rest = strings.TrimPrefix(rest, verb)
			}
			return rest
		}
	}
	return doc
}

// Markdown renders vars as the README's table, sorted as given.
func Markdown(vars []Var) string {
	var b strings.Builder
	b.WriteString("| variable | used by | meaning |\n| --- | --- | --- |\n")
	for _, v := range vars {
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", v.Name, v.UsedBy, strings.ReplaceAll(v.Meaning, "|", `\|`))
	}
	return b.String()
}

// Literals lists the WEIR_* names that appear as string literals in the
// non-test Go files given: every variable a process reads.
func Literals(files ...string) ([]string, error) {
	seen := map[string]bool{}
	lit := regexp.MustCompile(`^"(WEIR_[A-Z0-9_]+)"$`)
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			return nil, fmt.Errorf("configdoc: %w", err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			if bl, ok := n.(*ast.BasicLit); ok && bl.Kind == token.STRING {
				if m := lit.FindStringSubmatch(bl.Value); m != nil {
					seen[m[1]] = true
				}
			}
			return true
		})
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out, nil
}

// Replace puts table between the begin and end markers of doc.
func Replace(doc, begin, end, table string) (string, error) {
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		return "", fmt.Errorf("configdoc: markers %q … %q not found", begin, end)
	}
	return doc[:i+len(begin)] + "\n" + table + doc[j:], nil
}
