package weir

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestArchitectureNames keeps docs/architecture.md true as the code
// moves: every path it names exists, every function it names (`name()`)
// is a Go or SQL function of the repository, and it quotes no durations,
// which live in the code and drift in prose.
func TestArchitectureNames(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	funcs := map[string]bool{}
	goFunc := regexp.MustCompile(`(?m)^func (?:\([^)]*\) )?(\w+)[\[(]`)
	sqlFunc := regexp.MustCompile(`(?i)\bFUNCTION\s+(\w+)\s*\(`)
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != "." {
			return filepath.SkipDir
		}
		paths = append(paths, filepath.ToSlash(path))
		var re *regexp.Regexp
		switch filepath.Ext(path) {
		case ".go":
			re = goFunc
		case ".sql":
			re = sqlFunc
		default:
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range re.FindAllSubmatch(src, -1) {
			funcs[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	exists := func(p string) bool {
		p = strings.TrimSuffix(p, "/")
		for _, have := range paths {
			if have == p || strings.HasSuffix(have, "/"+p) {
				return true
			}
		}
		return false
	}

	// Fenced blocks (the diagram) quote nothing.
	raw := string(doc)
	doc = regexp.MustCompile("(?s)```.*?```").ReplaceAll(doc, nil)
	quoted := regexp.MustCompile("`([^`\n]+)`")
	call := regexp.MustCompile(`^(?:[\w.]+\.)?(\w+)\(\)$`)
	pathLike := regexp.MustCompile(`^[\w./-]+\.(go|sql|md|proto|yaml)$|^[\w.-]+(/[\w.-]*)+$`)
	for _, m := range quoted.FindAllStringSubmatch(string(doc), -1) {
		q := m[1]
		switch {
		case call.MatchString(q):
			if name := call.FindStringSubmatch(q)[1]; !funcs[name] {
				t.Errorf("docs/architecture.md names %s, which is no function of the repository", q)
			}
		case pathLike.MatchString(q) && !strings.HasPrefix(q, "/"):
			if !exists(q) {
				t.Errorf("docs/architecture.md names %s, which does not exist", q)
			}
		}
	}

	duration := regexp.MustCompile(`\b\d+(\.\d+)? ?(ms|s|min|minutes?|h|hours?|days?)\b`)
	for i, line := range strings.Split(raw, "\n") {
		if d := duration.FindString(quoted.ReplaceAllString(line, "")); d != "" {
			t.Errorf("docs/architecture.md:%d quotes a duration (%q): name the constant or function that holds it", i+1, d)
		}
	}
}
