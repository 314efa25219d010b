package people

import "testing"

func TestMapping(t *testing.T) {
	t.Parallel()
	m, err := ParseMapping(" admin=Alice@Example.com, ops@example.com ; operator=bob@example.com;viewer=*@example.com;viewer=carol@other.org")
	if err != nil {
		t.Fatal(err)
	}
	for email, want := range map[string]Role{
		"alice@example.com":  Admin,
		"ALICE@example.com":  Admin,
		"ops@example.com":    Admin,
		"bob@example.com":    Operator,
		"dave@example.com":   Viewer,
		"carol@other.org":    Viewer,
		"dave@other.org":     None,
		"alice@example.com.": None,
		"example.com":        None,
		"":                   None,
		"x@sub.example.com":  None,
	} {
		if got := m.RoleOf(email); got != want {
			t.Errorf("RoleOf(%q) = %v, want %v", email, got, want)
		}
	}
	for _, bad := range []string{"", ";", "root=a@b.c", "admin", "admin=alice", "admin=a*@b.c", "admin=*@*.c", "admin=@b.c"} {
		if _, err := ParseMapping(bad); err == nil {
			t.Errorf("ParseMapping(%q) accepted", bad)
		}
	}
	if !(Viewer < Operator && Operator < Admin && None < Viewer) {
		t.Error("roles out of order")
	}
}
