package main

// ferry users: the SASL credential store (sasl.credentials_file) of SCRAM
// and PLAIN. A password is read from stdin (its first line) or from
// --password-file, never from a flag, so it stays out of the shell history
// and the process list. The store keeps a salted SCRAM credential per
// mechanism, never the password; a running member reads the file again
// when it changes.

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/ferry-gw/ferry/clientauth"
)

const usersUsage = `Usage:
  ferry users add    --store FILE --user NAME [--mechanism M[,M]] [--iterations N] [--password-file F]
  ferry users list   --store FILE
  ferry users delete --store FILE --user NAME

add creates or replaces NAME's credentials, reading the password from the
first line of stdin (or of --password-file). --mechanism defaults to
SCRAM-SHA-512,SCRAM-SHA-256; PLAIN logins are checked against either.
`

func usersCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usersUsage)
		return usageError{errors.New("users: add, list or delete?")}
	}
	sub := args[0]
	fs := flag.NewFlagSet("ferry users "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usersUsage); fs.PrintDefaults() }
	store := fs.String("store", "", "the credential store `file` (sasl.credentials_file)")
	var user, mechs, pwFile *string
	var iterations *int
	switch sub {
	case "add":
		user = fs.String("user", "", "the user `name`")
		mechs = fs.String("mechanism", clientauth.MechanismSCRAMSHA512+","+clientauth.MechanismSCRAMSHA256, "SCRAM `mechanisms`, comma-separated")
		iterations = fs.Int("iterations", clientauth.DefaultSCRAMIterations, "PBKDF2 iterations (at least 4096)")
		pwFile = fs.String("password-file", "", "read the password from this `file` instead of stdin")
	case "delete":
		user = fs.String("user", "", "the user `name`")
	case "list":
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usersUsage)
		return nil
	default:
		fmt.Fprint(stderr, usersUsage)
		return usageError{fmt.Errorf("users: unknown command %q", sub)}
	}
	if err := parseArgs(fs, "users "+sub, args[1:]); err != nil {
		return flagsError(err)
	}
	if *store == "" {
		return usageError{fmt.Errorf("users %s: --store FILE is required", sub)}
	}
	if user != nil && *user == "" {
		return usageError{fmt.Errorf("users %s: --user NAME is required", sub)}
	}
	creds, err := clientauth.LoadCredentials(*store)
	if err != nil {
		return err
	}
	switch sub {
	case "list":
		for _, u := range creds.Names() {
			var ms []string
			for m := range creds.Users[u] {
				ms = append(ms, m)
			}
			slices.Sort(ms)
			fmt.Fprintf(stdout, "%s\t%s\n", u, strings.Join(ms, ","))
		}
		return nil
	case "delete":
		if _, ok := creds.Users[*user]; !ok {
			return fmt.Errorf("users delete: no user %q in %s", *user, *store)
		}
		delete(creds.Users, *user)
		if err := creds.Save(*store); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "deleted %s\n", *user)
		return nil
	}
	var list []string
	for _, m := range strings.Split(*mechs, ",") {
		if m = strings.TrimSpace(m); m != "" && !slices.Contains(list, m) {
			list = append(list, m)
		}
	}
	if len(list) == 0 {
		return usageError{errors.New("users add: --mechanism names no mechanism")}
	}
	pw, err := readPassword(*pwFile, stdin)
	if err != nil {
		return err
	}
	for _, m := range list {
		cred, err := clientauth.NewSCRAMCredential(m, pw, *iterations)
		if err != nil {
			return usageError{fmt.Errorf("users add: %w", err)}
		}
		creds.Set(*user, m, cred)
	}
	// Mechanisms not named keep no stale credential of an old password.
	for m := range creds.Users[*user] {
		if !slices.Contains(list, m) {
			delete(creds.Users[*user], m)
		}
	}
	if err := creds.Save(*store); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "set %s (%s) in %s\n", *user, strings.Join(list, ","), *store)
	return nil
}

// readPassword reads the first line of file, or of stdin without one.
func readPassword(file string, stdin io.Reader) (string, error) {
	r := stdin
	if file != "" {
		f, err := os.Open(file)
		if err != nil {
			return "", err
		}
		defer f.Close()
		r = f
	}
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	pw := strings.TrimRight(line, "\r\n")
	if pw == "" {
		return "", usageError{errors.New("users add: empty password (give it on stdin, or in --password-file)")}
	}
	return pw, nil
}
