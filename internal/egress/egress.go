// Package egress is an account's egress proxy, for both planes: it reads
// a proxy URL (http://, https://, socks5://, socks5h://, with user:pass@
// when the proxy needs them), names it without its credentials
// (scheme://host:port), builds the HTTP transports that go through it and
// keeps them (Clients), and says when a request failed at the proxy
// rather than at the upstream behind it (Failure).
//
// A proxy URL may hold a password: nothing here puts one in an error,
// and Display is the only form of a URL meant to be shown.
package egress

import (
	"errors"
	"net"
	"net/url"
	"strconv"
)

// Direct is what an account names to bypass the default proxy.
const Direct = "direct"

// defaultPorts are the schemes a proxy may have, with the port each
// dials when the URL names none (as net/http dials them).
var defaultPorts = map[string]string{"http": "80", "https": "443", "socks5": "1080", "socks5h": "1080"}

// Parse reads a proxy URL and returns it with nothing but its scheme,
// credentials and host. Its errors say what is wrong without quoting the
// URL.
func Parse(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("not a URL (want scheme://[user:pass@]host:port)")
	}
	if _, ok := defaultPorts[u.Scheme]; !ok {
		return nil, errors.New("the scheme must be http, https, socks5 or socks5h")
	}
	if u.Opaque != "" || u.Hostname() == "" {
		return nil, errors.New("a host is required (scheme://[user:pass@]host:port)")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, errors.New("the port must be between 1 and 65535")
		}
	} else if u.Host[len(u.Host)-1] == ':' {
		return nil, errors.New("the port must be between 1 and 65535")
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return nil, errors.New("a proxy URL has no path, query or fragment")
	}
	if u.User != nil {
		pass, _ := u.User.Password()
		name := u.User.Username()
		if name == "" {
			return nil, errors.New("credentials need a user name (user:pass@)")
		}
		// SOCKS5's user/password method carries each in at most 255 bytes
		// (RFC 1929); an HTTP proxy's Basic credentials are bounded here
		// alike.
		if len(name) > 255 || len(pass) > 255 {
			return nil, errors.New("the user name and password are at most 255 bytes each")
		}
	}
	return &url.URL{Scheme: u.Scheme, User: u.User, Host: u.Host}, nil
}

// Display names a proxy by scheme://host:port, without its credentials;
// the port is the one dialled when the URL names none.
func Display(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = defaultPorts[u.Scheme]
	}
	return u.Scheme + "://" + net.JoinHostPort(u.Hostname(), port)
}

// Redact is raw as it may be shown: "" and Direct as they are, a proxy
// URL as Display has it, and anything else "(invalid)".
func Redact(raw string) string {
	if raw == "" || raw == Direct {
		return raw
	}
	u, err := Parse(raw)
	if err != nil {
		return "(invalid)"
	}
	return Display(u)
}
