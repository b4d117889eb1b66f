# Sourced by the bench scripts: where the SQLite amalgamation is, and a part
# of it that compiles on its own.

# The amalgamation of libsqlite3-sys 0.30.1 in the cargo registry (nothing
# printed if it is not there).
registry_sqlite_c() {
    ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/libsqlite3-sys-0.30.1/sqlite3/sqlite3.c 2>/dev/null | sed -n 1p
}

# cut_sqlite_slice SRC OUT FROM: writes to OUT the lines of SRC up to the
# first `}` in column 0 after line FROM that is outside any preprocessor
# conditional (the end of a top-level function), and prints that line's
# number.
cut_sqlite_slice() {
    local src=$1 out=$2 from=$3 end
    end=$(awk -v from="$from" '/^[ \t]*#[ \t]*if/ { d++ } /^[ \t]*#[ \t]*endif/ { d-- }
        /^}$/ && d == 0 && NR > from { print NR; exit }' "$src")
    head -n "$end" "$src" >"$out"
    echo "$end"
}

# fetch_sqlite_into DIR: fetches the libsqlite3-sys 0.30.1 crate (its
# bundled amalgamation) with a throwaway cargo project in DIR and prints
# the path of its sqlite3.c.
fetch_sqlite_into() {
    local proj=$1
    mkdir -p "$proj/src"
    cat >"$proj/Cargo.toml" <<'EOF'
[package]
name = "sqlite-fetch"
version = "0.0.0"
edition = "2021"
publish = false

[workspace]

[dependencies]
libsqlite3-sys = { version = "=0.30.1", features = ["bundled"] }
EOF
    echo 'fn main() {}' >"$proj/src/main.rs"
    (cd "$proj" && cargo fetch -q >&2)
    local f
    f=$(registry_sqlite_c)
    if [[ -z $f ]]; then
        echo "sqlite3.c not found under ${CARGO_HOME:-$HOME/.cargo}/registry/src after cargo fetch" >&2
        return 1
    fi
    echo "$f"
}
