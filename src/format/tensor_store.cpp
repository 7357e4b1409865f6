// TensorStore: every tensor of a checkpoint across its safetensors files.
//
// Layouts, in the order they are tried for a folder: model.safetensors.index.json (HF sharding),
// model.safetensors, then every *.safetensors in the folder. A single file is a store of its own.
#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/format/safetensors.hpp"

namespace exl3 {
namespace fs = std::filesystem;
namespace {

using FileList = std::vector<std::shared_ptr<const SafetensorsFile>>;

// Shard file names come from the index: keep them inside the checkpoint folder.
void check_shard_name(const std::string& file, const std::string& tensor, const fs::path& index) {
  const fs::path p(file);
  if (file.empty() || p.is_absolute() || p.has_parent_path() || file == "." || file == "..") {
    fail("{}: weight_map['{}']: shard '{}' must be a file name inside the checkpoint folder",
         index.string(), tensor, file);
  }
}

FileList open_sharded(const fs::path& dir, const fs::path& index) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(index));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON ({})", index.string(), e.what());
  }
  if (!j.is_object() || !j.contains("weight_map")) fail("{}: missing 'weight_map'", index.string());
  const auto& wm = j["weight_map"];
  if (!wm.is_object()) fail("{}: 'weight_map' must be an object of tensor -> file", index.string());
  if (wm.empty()) fail("{}: 'weight_map' lists no tensors", index.string());

  std::map<std::string, std::vector<std::string>> by_file;  // shard -> tensors it must hold
  for (const auto& [tensor, file] : wm.items()) {
    if (!file.is_string())
      fail("{}: weight_map['{}'] must be a file name string", index.string(), tensor);
    const auto& name = file.get_ref<const std::string&>();
    check_shard_name(name, tensor, index);
    by_file[name].push_back(tensor);
  }

  FileList files;
  for (const auto& [name, tensors] : by_file) {
    const fs::path shard = dir / name;
    if (!fs::exists(
            shard)) {  // anything else that is not a regular file: SafetensorsFile::open says so
      fail(
          "{}: shard '{}' named in weight_map does not exist ({}); hint: the download is "
          "incomplete",
          index.string(), name, shard.string());
    }
    auto f = SafetensorsFile::open(shard);
    for (const auto& t : tensors) {
      if (f->find(t) == nullptr) {
        fail("{}: tensor '{}': weight_map names shard '{}', which does not contain it",
             index.string(), t, name);
      }
    }
    files.push_back(std::move(f));
  }
  return files;
}

FileList open_folder(const fs::path& dir) {
  if (const auto index = dir / "model.safetensors.index.json"; fs::exists(index)) {
    return open_sharded(dir, index);
  }
  if (const auto single = dir / "model.safetensors"; fs::exists(single)) {
    return {SafetensorsFile::open(single)};
  }
  std::vector<fs::path> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (it->path().extension() == ".safetensors" && it->is_regular_file(type_ec)) {
      found.push_back(it->path());
    }
  }
  if (ec) fail("{}: cannot list folder: {}", dir.string(), ec.message());
  if (found.empty()) {
    fail(
        "{}: no safetensors files (expected model.safetensors, model.safetensors.index.json or "
        "*.safetensors)",
        dir.string());
  }
  std::sort(found.begin(), found.end());
  FileList files;
  for (const auto& p : found) files.push_back(SafetensorsFile::open(p));
  return files;
}

}  // namespace

TensorStore TensorStore::open(const fs::path& path) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    fail("{}: cannot access: {}; hint: check the permissions of the path and its folders",
         path.string(), ec.message());
  }
  if (ec || !fs::exists(st)) fail("{}: no such file or folder", path.string());
  if (fs::is_directory(st)) return from_files(open_folder(path), path);
  if (path.extension() != ".safetensors") {
    fail("{}: not a .safetensors file or a checkpoint folder", path.string());
  }
  return from_files({SafetensorsFile::open(path)}, path);
}

TensorStore TensorStore::from_files(FileList files, const fs::path& root) {
  TensorStore s;
  s.root_ = root;
  s.files_ = std::move(files);
  for (const auto& f : s.files_) {
    for (const auto& t : f->tensors()) {
      const auto [it, inserted] = s.refs_.emplace(t.name, TensorRef{f.get(), &t});
      if (!inserted) {
        fail("{}: tensor '{}': stored twice, in {} and {}", root.string(), t.name,
             it->second.path().string(), f->path().string());
      }
      s.names_.push_back(t.name);
    }
  }
  std::sort(s.names_.begin(), s.names_.end());
  return s;
}

uint64_t TensorStore::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, ref] : refs_) n += ref.info->nbytes();
  return n;
}

const TensorRef* TensorStore::find(std::string_view name) const {
  const auto it = refs_.find(std::string(name));
  return it == refs_.end() ? nullptr : &it->second;
}

const TensorRef& TensorStore::at(std::string_view name) const {
  if (const TensorRef* r = find(name)) return *r;
  fail("{}: tensor '{}': not in this checkpoint", root_.string(), name);
}

}  // namespace exl3
