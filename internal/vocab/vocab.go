// Package vocab translates the proto enums of types.proto to and from the
// short lower-case names the database and stored evidence spell them by
// ("anthropic", "oauth", "rate_limited"): the vocabulary is defined once,
// in proto/weir/v1/types.proto, and these functions are its only
// translation.
package vocab

import (
	"strconv"
	"strings"
	"sync"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// Enum is a generated proto enum.
type Enum interface {
	~int32
	Descriptor() protoreflect.EnumDescriptor
	Number() protoreflect.EnumNumber
}

// Name is "rate_limited" for COOLDOWN_REASON_RATE_LIMITED: one map read
// (the data plane names a provider and a family on every request).
func Name[E Enum](v E) string {
	if name, ok := table(v.Descriptor()).byNumber[v.Number()]; ok {
		return name
	}
	// A value this build does not know (a newer peer's): its number, not
	// a panic.
	return strconv.Itoa(int(v.Number()))
}

// Value parses a short name back; unknown names give the zero value. A
// name spelled as stored is one map read (the routing view converts every
// account of every Acquire); another spelling is parsed.
func Value[E Enum](name string) E {
	var zero E
	if name == "" {
		return zero
	}
	d := zero.Descriptor()
	if n, ok := table(d).byName[name]; ok {
		return E(n)
	}
	v := d.Values().ByName(protoreflect.Name(Prefix(d) + strings.ToUpper(name)))
	if v == nil {
		return zero
	}
	return E(v.Number())
}

// tables holds each enum's names both ways, built on first use:
// protoreflect.FullName → *names.
var tables sync.Map

// names are an enum's short names by number, and its numbers by short
// name.
type names struct {
	byNumber map[protoreflect.EnumNumber]string
	byName   map[string]protoreflect.EnumNumber
}

func table(d protoreflect.EnumDescriptor) *names {
	if t, ok := tables.Load(d.FullName()); ok {
		return t.(*names)
	}
	vals := d.Values()
	t := &names{byNumber: make(map[protoreflect.EnumNumber]string, vals.Len()),
		byName: make(map[string]protoreflect.EnumNumber, vals.Len())}
	prefix := Prefix(d)
	for i := range vals.Len() {
		v := vals.Get(i)
		name := strings.ToLower(strings.TrimPrefix(string(v.Name()), prefix))
		t.byName[name] = v.Number()
		if _, ok := t.byNumber[v.Number()]; !ok {
			t.byNumber[v.Number()] = name // an alias names its number's first value, as ByNumber does
		}
	}
	tables.Store(d.FullName(), t)
	return t
}

// Prefix is "COOLDOWN_REASON_" for CooldownReason, following buf's
// STANDARD lint rule that every value is prefixed with the enum's name.
func Prefix(d protoreflect.EnumDescriptor) string {
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
