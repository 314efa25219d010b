package controlplane

import (
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/vocab"
)

// The database stores the proto enums by their short lower-case names
// ("anthropic", "oauth", "rate_limited"), so the vocabulary is defined once,
// in proto/weir/v1/types.proto, and internal/vocab is its only translation.

type protoEnum = vocab.Enum

// enumName is "rate_limited" for COOLDOWN_REASON_RATE_LIMITED.
func enumName[E protoEnum](v E) string { return vocab.Name(v) }

// enumValue parses a short name back; unknown names give the zero value.
func enumValue[E protoEnum](name string) E { return vocab.Value[E](name) }

// transientReason says whether a cooldown reason can pass on its own. Only
// a rejected credential needs an operator. The quota reasons are transient
// because they end by time (a window's reset, the out-of-credits floor):
// routing never calls them permanent, so a hold fails at once on them only
// when their deadline falls after its budget, never because they "cannot
// recover".
func transientReason(r weirv1.CooldownReason) bool {
	switch r {
	case weirv1.CooldownReason_COOLDOWN_REASON_INVALID_CREDENTIAL:
		return false
	}
	return true
}

// orZero is *p, or the zero value for nil: a nullable column read as its
// type's zero.
func orZero[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
