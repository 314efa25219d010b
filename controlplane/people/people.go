// Package people is who may do what: the roles and the mapping from a
// signed-in person's email to one. Pure: the control plane's interceptor
// and the dashboard both decide with it.
package people

import (
	"errors"
	"fmt"
	"strings"
)

// Role orders what a caller may do; each role may do all a lower one may.
type Role int

const (
	// None is no access at all: a person the mapping does not name.
	None Role = iota
	// Viewer reads everything an operator sees, changes nothing.
	Viewer
	// Operator also acts on accounts: pause, resume, clear a cooldown,
	// refresh usage, claim a reset.
	Operator
	// Admin also changes keys, settings, aliases, teams, budgets,
	// notifications, prices and accounts' credentials, and deletes. The
	// admin token is this role.
	Admin
)

var roleNames = [...]string{None: "none", Viewer: "viewer", Operator: "operator", Admin: "admin"}

func (r Role) String() string {
	if r < None || r > Admin {
		return "none"
	}
	return roleNames[r]
}

// ParseRole reads a role's name.
func ParseRole(s string) (Role, error) {
	for r, n := range roleNames {
		if r != int(None) && n == s {
			return Role(r), nil
		}
	}
	return None, fmt.Errorf("unknown role %q (want admin, operator or viewer)", s)
}

// Mapping gives each role the emails (or *@domain patterns) holding it.
//
// Emails rather than a provider's group or role claim: every OpenID
// provider issues a verified email, while group claims differ by provider
// and need configuring there; one variable in weir's environment is the
// whole access list, and reviewing it needs no provider console.
type Mapping struct {
	// byRole[r] are the patterns granting r.
	byRole map[Role][]string
}

// ParseMapping reads "admin=alice@example.com,ops@example.com;operator=bob@example.com;viewer=*@example.com".
// Emails compare without case; "*@domain" matches every address of the
// domain.
func ParseMapping(s string) (Mapping, error) {
	m := Mapping{byRole: map[Role][]string{}}
	for part := range strings.SplitSeq(s, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, list, ok := strings.Cut(part, "=")
		if !ok {
			return Mapping{}, fmt.Errorf("%q: want role=email,email", part)
		}
		role, err := ParseRole(strings.TrimSpace(name))
		if err != nil {
			return Mapping{}, err
		}
		for p := range strings.SplitSeq(list, ",") {
			p = strings.ToLower(strings.TrimSpace(p))
			if p == "" {
				continue
			}
			local, domain, ok := strings.Cut(p, "@")
			if !ok || local == "" || domain == "" || strings.ContainsAny(domain, "*@") || (strings.Contains(local, "*") && local != "*") {
				return Mapping{}, fmt.Errorf("%q: want an email or *@domain", p)
			}
			m.byRole[role] = append(m.byRole[role], p)
		}
	}
	if len(m.byRole) == 0 {
		return Mapping{}, errors.New("names nobody: want e.g. admin=alice@example.com;viewer=*@example.com")
	}
	return m, nil
}

// RoleOf is the highest role whose patterns match email; None when none
// does.
func (m Mapping) RoleOf(email string) Role {
	email = strings.ToLower(strings.TrimSpace(email))
	_, domain, ok := strings.Cut(email, "@")
	if !ok || domain == "" {
		return None
	}
	for _, r := range []Role{Admin, Operator, Viewer} {
		for _, p := range m.byRole[r] {
			if p == email || p == "*@"+domain {
				return r
			}
		}
	}
	return None
}

// The credentials a person or script proves who they are with, as the
// audit log names them.
const (
	CredentialAdminToken = "admin_token"
	CredentialOIDC       = "oidc"
)
