// Package modelpattern is the grammar of a client key's model allowlist,
// shared by the control plane (which stores and enforces it) and the data
// plane (which refuses a request before anything is leased): a pattern is
// an exact model name, or a prefix followed by one trailing *. Family is
// the model families routing goes by, which both planes read as well.
package modelpattern

import (
	"errors"
	"strings"
	"unicode"
)

// MaxLen bounds one pattern.
const MaxLen = 128

// Valid says whether p is a pattern, and if not, why.
func Valid(p string) error {
	switch {
	case p == "":
		return errors.New("empty pattern")
	case len(p) > MaxLen:
		return errors.New("longer than 128 characters")
	case strings.IndexFunc(p, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }) >= 0:
		return errors.New("contains white space or a control character")
	case strings.ContainsAny(p[:len(p)-1], "*?[]"):
		return errors.New("only a trailing * is supported (e.g. claude-sonnet-*)")
	case strings.ContainsAny(p[len(p)-1:], "?[]"):
		return errors.New("only a trailing * is supported (e.g. claude-sonnet-*)")
	}
	return nil
}

// Match says whether model is allowed by patterns; no patterns allow any
// model, and so does a request without a model (a model list, say).
func Match(patterns []string, model string) bool {
	if len(patterns) == 0 || model == "" {
		return true
	}
	for _, p := range patterns {
		if prefix, ok := strings.CutSuffix(p, "*"); ok {
			if strings.HasPrefix(model, prefix) {
				return true
			}
		} else if p == model {
			return true
		}
	}
	return false
}

// Family groups models that share provider capacity: Claude's opus,
// sonnet and haiku (whatever their version), else the model itself,
// lowercased. Routing's family gates and breakers go by it, and a worker
// keeps the pool's standing per key and family.
func Family(model string) string {
	m := strings.ToLower(model)
	for _, f := range []string{"opus", "sonnet", "haiku"} {
		if strings.Contains(m, f) {
			return f
		}
	}
	return m
}
