#!/bin/bash
# Readies iproute2 (ip, tc) for a machine whose image lacks it (the GPU machine the device tool lends:
# ../shared/reference/gpu-machine.md), here, where Debian's archive can be reached: the packages downloaded and
# unpacked into .iproute/ (ignored by git; carry it with the device tool), and .iproute/wrap/{ip,tc} that run
# them through the dynamic loader with their own libraries, so nothing else in the job sees those. Put
# .iproute/wrap first on PATH there; benchmarks/gpu_machine.sh's cluster step does.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)/.iproute
rm -rf "$root" && mkdir -p "$root/debs" "$root/wrap"
cd "$root/debs"
apt-get download iproute2 libbpf1 libelf1 libmnl0 libxtables12 libcap2 libtirpc3 libdb5.3 libselinux1 \
    libpcre2-8-0 libzstd1 zlib1g libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2 \
    libkeyutils1 >/dev/null
for deb in *.deb; do dpkg -x "$deb" "$root"; done
rm -rf "$root/debs"
for tool in bin/ip sbin/tc; do
    cat > "$root/wrap/$(basename $tool)" <<WRAP
#!/bin/sh
D=\$(cd "\$(dirname "\$0")/.." && pwd)
exec /lib64/ld-linux-x86-64.so.2 --library-path "\$D/lib/x86_64-linux-gnu:\$D/usr/lib/x86_64-linux-gnu" "\$D/$tool" "\$@"
WRAP
    chmod +x "$root/wrap/$(basename $tool)"
done
echo "iproute2 in $root ($(du -sh "$root" | cut -f1)); carry .iproute"
