# syntax=docker/dockerfile:1
# couch-ledger as a service (`couch-ledger serve`), in a small image that runs as a non-root user.
#
#   docker build -t couch-ledger .
#   docker run --rm -p 127.0.0.1:8080:8080 -e COUCHDB_URL=http://host:5984 \
#     -e COUCHDB_USER=admin -e COUCHDB_PASSWORD=… couch-ledger serve --init
#
# docker-compose.yml has it as the `ledger` service next to CouchDB (profile `service`).

# Build: the program's release binary with its default features (the command line and `serve`).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# No debug info in the image's binary (the repository's release profile keeps some for
# profiling).
ENV CARGO_PROFILE_RELEASE_DEBUG=0
RUN cargo build --release --locked -p couch-ledger-cli --bin couch-ledger \
    && cp target/release/couch-ledger /couch-ledger

# Run: glibc, libgcc and CA certificates, no shell, no package manager; user nonroot (65532).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /couch-ledger /usr/local/bin/couch-ledger
USER nonroot:nonroot
ENV COUCH_LEDGER_LISTEN=0.0.0.0:8080
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/couch-ledger"]
CMD ["serve"]
