package controlplane

import (
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// The database stores the proto enums by their short lower-case names
// ("anthropic", "oauth", "rate_limited"), so the vocabulary is defined once,
// in proto/weir/v1/types.proto, and these helpers are its only translation.

type protoEnum interface {
	~int32
	Descriptor() protoreflect.EnumDescriptor
	Number() protoreflect.EnumNumber
}

// enumName is "rate_limited" for COOLDOWN_REASON_RATE_LIMITED.
func enumName[E protoEnum](v E) string {
	d := v.Descriptor()
	full := string(d.Values().ByNumber(v.Number()).Name())
	return strings.ToLower(strings.TrimPrefix(full, enumPrefix(d)))
}

// enumValue parses a short name back; unknown names give the zero value.
func enumValue[E protoEnum](name string) E {
	var zero E
	d := zero.Descriptor()
	v := d.Values().ByName(protoreflect.Name(enumPrefix(d) + strings.ToUpper(name)))
	if v == nil || name == "" {
		return zero
	}
	return E(v.Number())
}

// enumPrefix is "COOLDOWN_REASON_" for CooldownReason, following buf's
// STANDARD lint rule that every value is prefixed with the enum's name.
func enumPrefix(d protoreflect.EnumDescriptor) string {
	name := string(d.Name())
	var b strings.Builder
	for i, r := range name {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String()) + "_"
}

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
